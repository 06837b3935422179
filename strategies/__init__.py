"""Strategies: pure coroutines over the engine's requests (base.py), one registry (registry.py)."""
