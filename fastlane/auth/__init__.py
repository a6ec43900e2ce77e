"""Authentication and authorisation: API tokens, roles, and TLS."""
