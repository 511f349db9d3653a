"""The front end: request checks, the OpenAI responses' answer field, flags, metrics, the load test."""
