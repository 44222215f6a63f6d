#!/bin/sh
# The credentials jobs of docker-compose.yml (SEC-3). `issue-creds.sh stack` makes the keys
# on the first `docker compose up` and gives every container its own identity;
# `issue-creds.sh collector` gives the host agent (profile "node") its node's.
#
# /keys (volume creds-keys): the operator, account and signing keys. Only these jobs and
#   nats-server mount it, so a service cannot mint an identity.
# /creds (volume creds): one NAME.creds per container, mounted read-only into them.
#
# Credentials already issued are kept, as `healthplane up` keeps them: a second `up` issues
# nothing new, and `healthplane creds list` stays the list of who holds what. To replace one
# (after `creds revoke`, or a renamed host), delete its file and run the job again.
set -eu

keys=/keys
out=/creds

# issue NAME ARGS...: `healthplane creds ARGS` into /creds/NAME.creds, unless it is there.
issue() {
    name=$1
    shift
    if [ -s "$out/$name.creds" ]; then
        echo "creds: keeping $out/$name.creds"
    else
        healthplane creds "$@" --keys "$keys" -o "$out/$name.creds"
    fi
}

case "${1:-}" in
stack)
    # Keys that exist are kept; the account is re-signed with this image's permissions.
    healthplane creds init --keys "$keys"
    # nats-server's trust and resolver; the resolver keeps pushed account JWTs (revocations)
    # in the server's own volume, so they survive a restart.
    healthplane creds server-config --keys "$keys" --resolver-dir /data/jwt -o "$keys/nats-auth.conf"
    # The operator's, for the CLI (docker-compose.yml says how to use it).
    issue admin user admin --role admin
    # Applying config is an admin's right; its own name keeps it apart in the config history.
    issue config-apply user config-apply --role admin
    # Stream administration (SEC-10: converge, dead-letter replay, purge) is not the admin's:
    # the streams job makes the streams as one maintainer, an operator replays dead letters
    # as another (docker-compose.yml says how to use it).
    issue streams user streams --role maintainer
    issue maintainer user maintainer --role maintainer
    issue health-ingest service health-ingest
    issue scorer service scorer
    issue eviction service eviction
    issue policy service policy
    issue substrate-bridge service substrate-bridge
    issue webhook-dispatcher service webhook-dispatcher
    issue scheduler service scheduler
    issue slurm-adapter service slurm-adapter
    issue api service api
    # A bearer token for the web UI and the HTTP API (an admin's; `creds token` for others):
    #   docker compose exec api cat /creds/admin.token
    if [ ! -s "$out/admin.token" ]; then
        (umask 077 && healthplane creds token admin --role admin --keys "$keys" > "$out/admin.token")
    fi
    issue sim sim --cluster default
    ;;
collector)
    # The node id the collector reports under with --root /host: the first line of the
    # host's /etc/hostname that is neither blank nor a comment. The server lets the node
    # publish only under that id.
    node=$(sed -n -e '/^[[:space:]]*#/d' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' -e '/./{p;q;}' \
        /host/etc/hostname)
    if [ -z "$node" ]; then
        echo "creds: /host/etc/hostname names no host, so the collector's node id is unknown" >&2
        exit 1
    fi
    issue collector node "$node" --cluster default
    ;;
*)
    echo "usage: issue-creds.sh stack|collector" >&2
    exit 2
    ;;
esac
