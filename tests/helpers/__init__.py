"""Test helpers that need more than a module of their own (model writers, servers)."""
