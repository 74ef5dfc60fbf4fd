"""Capacity planning (issue 43): `llmgw plan`; the arithmetic in capacity.py, imports only the standard library."""
