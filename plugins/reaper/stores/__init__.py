"""Evidence sources, one module per external system: MongoDB (run store, leases), NATS KV (leases),
Postgres (step runs). Each answers in batches and with an explicit unknown for what it could not read."""
