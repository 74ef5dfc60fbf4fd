-- Settlement of one request: re-weight its token entries, release its concurrency lease, add spend.
-- KEYS, per bucket: L: log zset, weights hash | C: lease zset | S: spend counter
-- ARGV: member, then per bucket: kind, a, b (L: a = real tokens; S: a = usd, b = ttl_ms)
local member, k = ARGV[1], 1
for i = 2, #ARGV, 3 do
  local kind = ARGV[i]
  if kind == 'L' then
    local weights = KEYS[k + 1]
    k = k + 2
    local old = redis.call('HGET', weights, member)
    if old then
      local new = tonumber(ARGV[i + 1])
      redis.call('HSET', weights, member, new)
      redis.call('HINCRBY', weights, '_sum', new - tonumber(old))
    end
  elseif kind == 'C' then
    redis.call('ZREM', KEYS[k], member)
    k = k + 1
  else
    redis.call('INCRBYFLOAT', KEYS[k], ARGV[i + 1])
    redis.call('PEXPIRE', KEYS[k], ARGV[i + 2])
    k = k + 1
  end
end
return 1
