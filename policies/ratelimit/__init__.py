"""Fleet-exact rate limits and budgets: Redis (one Lua round trip per admission) or in-process."""
