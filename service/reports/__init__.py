"""What agents report about attempts (metrics, logs, events): stored idempotently, read by cursor."""
