"""Data sets, models and local training for the simulated clients."""
