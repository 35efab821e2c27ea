-- Write one message into the inbox of every live subscriber (or of one node),
-- in one atomic step.
-- ARGV: prefix, mode ("topic" or "direct"), topic or target node id, payload,
--       sender id, "drop" or "refuse", retain ttl ms (-1: not retained,
--       0: retained without expiry)
-- Returns {message id, nodes reached}, or {-1, node id} when mode "refuse"
-- finds a full inbox (nothing written), or {-2, node id} when a direct
-- target is not live.
-- A full inbox drops its oldest unread messages; each drop is counted in the
-- node's hash (field "dropped"). Each node's own limit is in its hash.
local prefix, mode, target, payload, sender = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now = now_ms()
local nodes_key = prefix .. ':nodes'
local function live(id)
  local expiry = redis.call('ZSCORE', nodes_key, id)
  return expiry and tonumber(expiry) > now
end

local targets = {}
if mode == 'direct' then
  if not live(target) then return {-2, target} end
  targets[1] = target
else
  local seen = {}
  local function add(key)
    for _, id in ipairs(redis.call('SMEMBERS', key)) do
      if not seen[id] then
        seen[id] = true
        if live(id) then targets[#targets + 1] = id end
      end
    end
  end
  add(prefix .. ':topic:' .. target .. ':subs')
  for _, pattern in ipairs(redis.call('SMEMBERS', prefix .. ':patterns')) do
    if matches(pattern, target) then add(prefix .. ':topic:' .. pattern .. ':subs') end
  end
end

-- Each target's inbox key, current length and limit.
local inboxes, lengths, limits = {}, {}, {}
for i, id in ipairs(targets) do
  inboxes[i] = prefix .. ':node:' .. id .. ':inbox'
  lengths[i] = redis.call('XLEN', inboxes[i])
  limits[i] = tonumber(redis.call('HGET', prefix .. ':node:' .. id, 'inbox_max') or '10000')
  if ARGV[6] == 'refuse' and lengths[i] >= limits[i] then return {-1, id} end
end

local id = redis.call('INCR', prefix .. ':msgseq')
local topic = ''
if mode ~= 'direct' then topic = target end
local ttl = tonumber(ARGV[7])
if mode ~= 'direct' and ttl >= 0 then
  local key = prefix .. ':topic:' .. topic .. ':retained'
  redis.call('SET', key, cmsgpack.pack({id, sender, payload}))
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
  redis.call('SADD', prefix .. ':retained', topic)
end
for i, inbox in ipairs(inboxes) do
  if lengths[i] >= limits[i] then
    redis.call('HINCRBY', prefix .. ':node:' .. targets[i], 'dropped', lengths[i] - limits[i] + 1)
  end
  redis.call('XADD', inbox, 'MAXLEN', limits[i], '*', 'i', id, 't', topic, 'f', sender, 'p', payload)
end
return {id, #targets}
