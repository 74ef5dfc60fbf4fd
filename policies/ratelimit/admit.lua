-- Admission of one request against all its buckets: all pass and are charged, or nothing changes.
-- KEYS, per bucket: L (rolling log): log zset, weights hash | C (concurrency): lease zset | B (budget): spend
-- ARGV: member, window_ms, lease_ms, then per bucket: kind, limit, cost
-- Returns: admitted, failed index (0 = none), then per bucket: used, reset_ms, retry_ms
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member, window, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local function prune(log, weights, cutoff)
  while true do
    local old = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff, 'LIMIT', 0, 500)
    if #old == 0 then return end
    local freed = 0
    for _, w in ipairs(redis.call('HMGET', weights, unpack(old))) do freed = freed + (tonumber(w) or 0) end
    redis.call('HDEL', weights, unpack(old))
    redis.call('ZREM', log, unpack(old))
    redis.call('HINCRBY', weights, '_sum', -freed)
    if #old < 500 then return end
  end
end

local function oldest_expiry(log)
  local first = redis.call('ZRANGE', log, 0, 0, 'WITHSCORES')
  if #first == 0 then return 0 end
  return tonumber(first[2]) + window - now
end

local function retry_ms(b)
  if b.cost > b.limit then return -1 end
  local need, freed, start = b.used + b.cost - b.limit, 0, 0
  while true do
    local entries = redis.call('ZRANGE', b.key, start, start + 127, 'WITHSCORES')
    if #entries == 0 then return window end
    local members = {}
    for j = 1, #entries, 2 do members[#members + 1] = entries[j] end
    local ws = redis.call('HMGET', b.weights, unpack(members))
    for j = 1, #members do
      freed = freed + (tonumber(ws[j]) or 0)
      if freed >= need then return tonumber(entries[2 * j]) + window - now end
    end
    start = start + 128
  end
end

local buckets, k = {}, 1
for i = 4, #ARGV, 3 do
  local b = {kind = ARGV[i], limit = tonumber(ARGV[i + 1]), cost = tonumber(ARGV[i + 2]), key = KEYS[k]}
  if b.kind == 'L' then
    b.weights = KEYS[k + 1]
    k = k + 2
    prune(b.key, b.weights, now - window)
    b.used = tonumber(redis.call('HGET', b.weights, '_sum') or '0')
    b.ok = b.used + b.cost <= b.limit
  elseif b.kind == 'C' then
    k = k + 1
    redis.call('ZREMRANGEBYSCORE', b.key, '-inf', now)
    b.used = redis.call('ZCARD', b.key)
    b.ok = b.used + 1 <= b.limit
  else
    k = k + 1
    b.used = tonumber(redis.call('GET', b.key) or '0')
    b.ok = b.used < b.limit
  end
  buckets[#buckets + 1] = b
end

local failed = 0
for j, b in ipairs(buckets) do
  if failed == 0 and not b.ok then failed = j end
end

local out = {failed == 0 and 1 or 0, failed}
for j, b in ipairs(buckets) do
  local retry = 0
  if failed == 0 and b.kind == 'L' then
    redis.call('ZADD', b.key, now, member)
    redis.call('HSET', b.weights, member, b.cost)
    redis.call('HINCRBY', b.weights, '_sum', b.cost)
    redis.call('PEXPIRE', b.key, window + 60000)
    redis.call('PEXPIRE', b.weights, window + 60000)
    b.used = b.used + b.cost
  elseif failed == 0 and b.kind == 'C' then
    redis.call('ZADD', b.key, now + lease, member)
    redis.call('PEXPIRE', b.key, lease)
    b.used = b.used + 1
  elseif failed == j and b.kind == 'L' then
    retry = retry_ms(b)
  end
  local reset = 0
  if b.kind == 'L' then reset = oldest_expiry(b.key) end
  out[#out + 1] = tostring(b.used)
  out[#out + 1] = reset
  out[#out + 1] = retry
end
return out
