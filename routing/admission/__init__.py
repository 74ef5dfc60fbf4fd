"""Admission by pool capacity: service classes, a bounded queue per class with weighted fair sharing between
tenants, deadline-aware refusals, shared across gateway replicas (docs/tenants-and-limits.md, "Overload")."""
