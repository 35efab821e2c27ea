-- Register (or re-register) a node incarnation.
-- KEYS: nodes, node hash, inbox
-- ARGV: node id, incarnation, lease ms, "1" if this is a recovery,
--       number of subscriptions N, N subscriptions, then field/value pairs
-- Returns {now ms, previous incarnation or ""}. A different previous
-- incarnation is replaced: a restart with a stable id wins, and a still-live
-- older process finds out on its next heartbeat.
-- On recovery the subscriptions are restored and a marker is appended to the
-- inbox, so the reader reports the recovery before any message published
-- after it. Retained messages are not delivered again.
-- The prefix is KEYS[1] without ":nodes"; keys built from it, not in KEYS:
-- P:node:ID:subs, P:topic:SUB:subs, P:patterns (the subscriptions) and
-- P:limits (the node's inbox_max, for publishers), P:packed (whether this
-- incarnation reads packed inbox entries, for publishers).
local now = now_ms()
local id = ARGV[1]
local prefix = string.sub(KEYS[1], 1, #KEYS[1] - #':nodes')
local previous = redis.call('HGET', KEYS[2], 'incarnation') or ''
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), id)
local nsubs = tonumber(ARGV[5])
for i = 6, 5 + nsubs do add_subscription(prefix, id, ARGV[i]) end
local fields = {'incarnation', ARGV[2], 'registered_at', now, 'heartbeat_at', now}
for i = 6 + nsubs, #ARGV, 2 do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
end
redis.call('HSET', KEYS[2], unpack(fields))
-- Publishers look up every target's inbox limit in one hash.
local limit = redis.call('HGET', KEYS[2], 'inbox_max')
if limit then redis.call('HSET', prefix .. ':limits', id, limit) end
-- Publishers write packed inbox entries (publish.lua) only to the
-- incarnation recorded here, which says it reads them: a process of an
-- older version registered again under this id leaves the record behind
-- with another incarnation than its own, and gets the older fields.
if redis.call('HGET', KEYS[2], 'inbox') == 'packed' then
  redis.call('HSET', prefix .. ':packed', id, ARGV[2])
else
  redis.call('HDEL', prefix .. ':packed', id)
end
if ARGV[4] == '1' then
  redis.call('XADD', KEYS[3], '*', 'k', 'recovered')
end
return {now, previous}
