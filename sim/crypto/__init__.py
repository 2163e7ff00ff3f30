"""Cryptographic primitives of the secure-aggregation protocols, from the ``cryptography`` package.

X25519 key agreement with HKDF-SHA256 (``agreement``), AES-GCM authenticated encryption (``aead``),
Ed25519 signatures (``signatures``), AES-256-CTR keystream masks reduced mod 2^bits (``prg``), Shamir
secret sharing over the prime field of 2^31 - 1, vectorised (``shamir``), and seeded deterministic
randomness for all of them (``randomness``). Pure: randomness comes in as an argument; nothing here
imports simpy, asyncio, socket or torch, or reads a clock.
"""
