"""Kafka wire codec, sans-I/O: bytes in, objects out, and back."""
