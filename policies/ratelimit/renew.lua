#!lua flags=allow-oom
-- Renewal of the leases of requests still in flight (concurrency slots, budget reservations).
-- KEYS: lease zsets; ARGV: lease_ms, then the member holding each key's lease (ARGV[i + 1] for KEYS[i]).
-- XX: a lease already released (or expired with its holder) is not brought back.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  if redis.call('ZADD', key, 'XX', 'CH', now + lease, ARGV[i + 1]) == 1 then
    redis.call('PEXPIRE', key, lease)
  end
end
return 1
