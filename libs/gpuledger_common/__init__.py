"""Shared adapters and helpers for the services: NATS, settings, logging, the fleet file."""
