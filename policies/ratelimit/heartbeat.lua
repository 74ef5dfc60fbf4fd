#!lua flags=allow-oom
-- One replica's heartbeat: note it as alive now, forget replicas silent for ARGV[2] ms, count the rest.
-- KEYS[1]: zset replica id -> last beat (ms, server time); ARGV: replica id, ms after which a replica is gone
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - gone)
redis.call('PEXPIRE', KEYS[1], gone)
return redis.call('ZCARD', KEYS[1])
