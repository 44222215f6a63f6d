"""What `healthplane up` starts and issues: nats-server, supervision, TLS, the keystore."""
