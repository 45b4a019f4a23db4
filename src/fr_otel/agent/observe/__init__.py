"""What this rank's Flight Recorder says: reading it, per-group progress and waits, the copy an incident sends (no store)."""
