#!lua flags=allow-oom
-- Settlement of one request: re-weight its token entries to the real usage, release its concurrency lease
-- and budget reservations, add its spend.
-- KEYS, per bucket: L: log zset, weights hash | C: lease zset | Q: reservation zset, weights hash
--                   S: spend counter
-- ARGV: member, bucket specs ("kind a b" per bucket; L: a = real tokens; S: a = usd, b = ttl_ms)
local member, k = ARGV[1], 1
for kind, a, b in string.gmatch(ARGV[2], '(%S+) (%S+) (%S+)') do
  if kind == 'L' then
    local weights = KEYS[k + 1]
    k = k + 2
    local old = redis.call('HGET', weights, member)
    if old then
      local new = tonumber(a)
      redis.call('HSET', weights, member, new)
      redis.call('HINCRBY', weights, '_sum', new - tonumber(old))
    end
  elseif kind == 'C' then
    redis.call('ZREM', KEYS[k], member)
    k = k + 1
  elseif kind == 'Q' then
    local weights = KEYS[k + 1]
    local reserved = redis.call('HGET', weights, member)
    if reserved then
      redis.call('HDEL', weights, member)
      redis.call('HINCRBYFLOAT', weights, '_sum', -tonumber(reserved))
    end
    redis.call('ZREM', KEYS[k], member)
    k = k + 2
  else
    redis.call('INCRBYFLOAT', KEYS[k], a)
    redis.call('PEXPIRE', KEYS[k], b)
    k = k + 1
  end
end
return 1
