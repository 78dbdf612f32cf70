"""A CA and serving certificates for the webhook, built with cryptography."""
