#!lua
-- Admission of one request against all its buckets: all pass and are charged, or nothing changes.
-- KEYS, per bucket: R (request log): zset | L (weighted log): zset, weights hash (field _sum = total)
--                   C (concurrency): lease zset
--                   B (budget): spend counter, reservation lease zset, reservation weights hash (USD, _sum)
-- Budgets count the spend plus what requests in flight reserved (their estimated cost, held under a lease
-- like a concurrency slot), so a burst cannot all pass before the first one settles.
-- ARGV: member, window_ms, lease_ms, bucket specs ("kind limit cost" per bucket, space-separated)
-- Returns: admitted, failed index (0 = none), then per bucket: used, reset_ms, retry_ms
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member, window, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl = window + 60000

local function prune_weighted(b, cutoff)
  local used = tonumber(redis.call('HGET', b.weights, '_sum') or '0')
  while true do
    local old = redis.call('ZRANGEBYSCORE', b.key, '-inf', cutoff, 'LIMIT', 0, 500)
    if #old == 0 then return used end
    for _, w in ipairs(redis.call('HMGET', b.weights, unpack(old))) do used = used - (tonumber(w) or 0) end
    redis.call('HDEL', b.weights, unpack(old))
    redis.call('ZREM', b.key, unpack(old))
    redis.call('HSET', b.weights, '_sum', used)
    if #old < 500 then return used end
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
    for j = 1, #entries, 2 do
      local weight = 1
      if b.weights then weight = tonumber(redis.call('HGET', b.weights, entries[j]) or '0') end
      freed = freed + weight
      if freed >= need then return tonumber(entries[j + 1]) + window - now end
    end
    start = start + 128
  end
end

local function check(b)
  if b.kind == 'R' then
    redis.call('ZREMRANGEBYSCORE', b.key, '-inf', now - window)
    b.used = redis.call('ZCARD', b.key)
    return b.used + b.cost <= b.limit
  elseif b.kind == 'L' then
    b.used = prune_weighted(b, now - window)
    return b.used + b.cost <= b.limit
  elseif b.kind == 'C' then
    redis.call('ZREMRANGEBYSCORE', b.key, '-inf', now)
    b.used = redis.call('ZCARD', b.key)
    return b.used + 1 <= b.limit
  end
  if redis.call('EXISTS', b.leases) == 0 then  -- every holder settled or expired: no stale total
    redis.call('DEL', b.weights)
    b.reserved = 0
  else
    b.reserved = math.max(0, prune_weighted({key = b.leases, weights = b.weights}, now))
  end
  b.used = tonumber(redis.call('GET', b.key) or '0') + b.reserved
  return b.used < b.limit
end

local function charge(b)
  if b.kind == 'R' or b.kind == 'L' then
    redis.call('ZADD', b.key, now, member)
    redis.call('PEXPIRE', b.key, ttl)
    b.used = b.used + b.cost
    if b.kind == 'L' then
      redis.call('HSET', b.weights, member, b.cost, '_sum', b.used)
      redis.call('PEXPIRE', b.weights, ttl)
    end
  elseif b.kind == 'C' then
    redis.call('ZADD', b.key, now + lease, member)
    redis.call('PEXPIRE', b.key, lease)
    b.used = b.used + 1
  elseif b.cost > 0 then
    redis.call('ZADD', b.leases, now + lease, member)
    redis.call('HSET', b.weights, member, b.cost, '_sum', b.reserved + b.cost)
    redis.call('PEXPIRE', b.leases, lease)
    redis.call('PEXPIRE', b.weights, 86400000)  -- renewals extend the lease zset only
    b.used = b.used + b.cost
  end
end

local buckets, k, failed = {}, 1, 0
for kind, limit, cost in string.gmatch(ARGV[4], '(%S+) (%S+) (%S+)') do
  local b = {kind = kind, limit = tonumber(limit), cost = tonumber(cost), key = KEYS[k]}
  k = k + 1
  if b.kind == 'L' then
    b.weights = KEYS[k]
    k = k + 1
  elseif b.kind == 'B' then
    b.leases, b.weights = KEYS[k], KEYS[k + 1]
    k = k + 2
  end
  if not check(b) and failed == 0 then failed = #buckets + 1 end
  buckets[#buckets + 1] = b
end

-- the reset time is computed for the tightest request log and the tightest token log (the headers' buckets)
local tightest = {}
for j, b in ipairs(buckets) do
  if failed == 0 then charge(b) end
  local best = tightest[b.kind]
  if best == nil or b.limit - b.used < buckets[best].limit - buckets[best].used then tightest[b.kind] = j end
end

local out = {failed == 0 and 1 or 0, failed}
for j, b in ipairs(buckets) do
  local retry, reset = 0, 0
  if failed == j and (b.kind == 'R' or b.kind == 'L') then retry = retry_ms(b) end
  if (b.kind == 'R' or b.kind == 'L') and tightest[b.kind] == j then reset = oldest_expiry(b.key) end
  out[#out + 1] = tostring(b.used)
  out[#out + 1] = reset
  out[#out + 1] = retry
end
return out
