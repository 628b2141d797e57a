"""Shared foundations: settings, JSON logs and the job protocol (Redis keys, records, events)."""
