#!lua flags=allow-oom
-- Replays one request admitted while Redis was unavailable into a rolling-window log, so the window counts it.
-- KEYS: R: log zset | L: log zset, weights hash. ARGV: member, admitted at (ms), weight (L), ttl_ms.
-- Idempotent: a member already in the log is left alone (a replay repeated after a failed probe).
if redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1]) == 0 then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if KEYS[2] then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  redis.call('HINCRBY', KEYS[2], '_sum', ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return 1
