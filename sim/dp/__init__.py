"""Distributed differential privacy: noise expanded from seeds, the DSkellam encoding, and accounting."""
