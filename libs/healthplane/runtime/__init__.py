"""What every service needs, in one place: connection, logs, metrics, the pull loop,
bounded async publishing, ordered replay, snapshots, exactly-once emit and the lifecycle.

Services supply a pure core; everything here is the adapter around it.
"""
