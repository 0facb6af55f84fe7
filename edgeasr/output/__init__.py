"""Transcripts out: the JSON messages (a public contract), the durable outbox and MQTT."""
