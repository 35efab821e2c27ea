-- Publish a batch of messages from one sender, in order. Each message is
-- written into the inbox of every live subscriber of its topic (or of its one
-- target node) atomically; batching only shares the per-call costs (the
-- clock, the pattern index, subscriber lookups) among messages.
-- KEYS: none: every key is built from the prefix (P:nodes, P:limits, P:packed,
-- P:topic:T:subs, P:patterns, P:node:X, P:node:X:inbox, P:node:X:commands,
-- P:topic:T:retained, P:retained, P:msgseq).
-- ARGV: prefix, sender, then per message 5 values:
--       mode ("topic", "direct", or "command": a direct message the target
--       node's engine acts on itself, written to its command stream, which
--       the application's inbox limit and drops never touch; into the
--       inbox, as before, for a node registered by an older version, whose
--       hash lacks commands=stream), topic or target node id, payload,
--       "drop" or "refuse", retain ttl ms (-1: not retained, 0: no expiry)
-- Returns one string, per message two words separated by spaces: message
-- id and nodes reached, or -1 and a node id when "refuse" met a full inbox
-- (nothing written for that message), or -2 and a node id when a direct
-- target is not live (node ids hold no spaces); an error, with nothing of
-- the batch written, for a retain ttl out of range. One string, not two
-- values per message: the client parses each value of a reply on its own.
-- Every message is decided before anything is written; then the ids of the
-- accepted ones are reserved at once (INCRBY P:msgseq), so ids only grow.
-- An inbox entry is one field, m = "ID TOPIC SENDER\nPAYLOAD" (TOPIC empty
-- for a direct message; neither a topic nor a node id can hold a space or
-- a newline), for a node whose incarnation said it reads that (P:packed
-- holds node id -> that incarnation, set by register.lua). Every value of
-- an entry costs the XADD, the XREAD's reply and above all the reader's
-- parsing once per message: one field instead of four halves the reader's
-- cost. For any other node (an older version, or one an older version
-- registered again under the same id) the entry has the fields i (message
-- id), t (topic; absent for a direct message), f (sender) and p (payload),
-- and k = "command" for a command in its inbox; an entry without k is a
-- message.
-- A full inbox drops its oldest unread messages; every drop is counted in
-- the node's hash (field "dropped"). Each node's limit is its own, from
-- P:limits (10000, DEFAULT_INBOX_MAX_LENGTH, when it has none). A command
-- stream keeps at most 100 entries (COMMANDS_MAX).
local prefix, sender = ARGV[1], ARGV[2]
local now = now_ms()
local nodes_key = prefix .. ':nodes'
local limits_key = prefix .. ':limits'
local packed_key = prefix .. ':packed'
local patterns = nil
local targets_of = {}  -- topic -> live subscriber ids, computed once per batch
local inbox = {}       -- node id -> {key, length, limit, packed}

-- Keeps the live ones of `ids` (lease valid on the Redis clock), and learns
-- their inbox length, limit and entry format. In chunks: unpack() has a
-- stack limit.
local function live_only(ids)
  local out = {}
  for from = 1, #ids, 500 do
    local chunk = {unpack(ids, from, math.min(from + 499, #ids))}
    local expiries = redis.call('ZMSCORE', nodes_key, unpack(chunk))
    local limits = redis.call('HMGET', limits_key, unpack(chunk))
    local packed = redis.call('HMGET', packed_key, unpack(chunk))
    for i, id in ipairs(chunk) do
      if expiries[i] and tonumber(expiries[i]) > now then
        out[#out + 1] = id
        if not inbox[id] then
          local node_key = prefix .. ':node:' .. id
          local key = node_key .. ':inbox'
          local reads_packed = packed[i]
            and packed[i] == redis.call('HGET', node_key, 'incarnation')
          inbox[id] = {key, redis.call('XLEN', key), tonumber(limits[i] or '10000'), reads_packed}
        end
      end
    end
  end
  return out
end

local function subscribers(topic)
  local cached = targets_of[topic]
  if cached then return cached end
  local ids, seen = {}, {}
  local function add(key)
    for _, id in ipairs(redis.call('SMEMBERS', key)) do
      if not seen[id] then seen[id] = true; ids[#ids + 1] = id end
    end
  end
  add(prefix .. ':topic:' .. topic .. ':subs')
  if not patterns then patterns = redis.call('SMEMBERS', prefix .. ':patterns') end
  for _, pattern in ipairs(patterns) do
    if matches(pattern, topic) then add(prefix .. ':topic:' .. pattern .. ':subs') end
  end
  cached = live_only(ids)
  targets_of[topic] = cached
  return cached
end

-- Refuse a bad batch before writing anything (the engine checks first; this
-- keeps a script error from leaving half a batch written).
local ttls = {}
for m = 3, #ARGV, 5 do
  local text = ARGV[m + 4]
  local ttl = -1
  if text ~= '-1' then ttl = tonumber(text) end
  ttls[m] = ttl
  if not ttl or ttl < -1 or ttl > 3153600000000 then -- config::MAX_RETAIN_MS
    return redis.error_reply('ERR retain ttl out of range: ' .. tostring(ARGV[m + 4]))
  end
end

-- Pass 1: decide every message (refused, or the inboxes it reaches and
-- what each must drop for it) before anything is written.
local decided = {}
-- Shared by every message that drops nothing (most of them).
local NO_DROPS = {}
local accepted = 0
for m = 3, #ARGV, 5 do
  local mode, target, overflow = ARGV[m], ARGV[m + 1], ARGV[m + 3]
  local ids, topic
  local direct = mode == 'direct' or mode == 'command'
  if direct then
    ids = live_only({target})
    topic = ''
  else
    ids = subscribers(target)
    topic = target
  end
  local to_stream = false
  if mode == 'command' and #ids == 1 then
    to_stream = redis.call('HGET', prefix .. ':node:' .. ids[1], 'commands') == 'stream'
  end
  local refused = nil
  if direct and #ids == 0 then
    refused = -2
  elseif to_stream then
    -- The command stream has its own bound (COMMANDS_MAX below).
  elseif overflow == 'refuse' then
    for _, id in ipairs(ids) do
      if inbox[id][2] >= inbox[id][3] then refused = -1; target = id; break end
    end
  end
  local drops = NO_DROPS
  if refused then
    -- nothing to account
  elseif to_stream then
    accepted = accepted + 1
  else
    accepted = accepted + 1
    for i = 1, #ids do
      local box = inbox[ids[i]]
      if box[2] >= box[3] then
        if drops == NO_DROPS then drops = {} end
        drops[i] = box[2] - box[3] + 1
        box[2] = box[3]
      else
        box[2] = box[2] + 1
      end
    end
  end
  decided[#decided + 1] = {refused, target, ids, topic, drops, to_stream}
end

-- Ids for the accepted messages, reserved before any write, so they only
-- ever increase whatever happens after.
local seq_key = prefix .. ':msgseq'
local seq = 0
if accepted > 0 then seq = redis.call('INCRBY', seq_key, accepted) - accepted end

-- Pass 2: write.
local out = {}
local reached_text = {}
for n, d in ipairs(decided) do
  local m = 3 + (n - 1) * 5
  local mode, payload, ttl = ARGV[m], ARGV[m + 2], ttls[m]
  local refused, target, ids, topic, drops, to_stream = d[1], d[2], d[3], d[4], d[5], d[6]
  if refused then
    out[#out + 1] = refused
    out[#out + 1] = target
  else
    seq = seq + 1
    if topic ~= '' and ttl >= 0 then
      local key = prefix .. ':topic:' .. topic .. ':retained'
      redis.call('SET', key, cmsgpack.pack({seq, sender, payload}))
      if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
      redis.call('SADD', prefix .. ':retained', topic)
    end
    -- %d: concatenation would print an id past 14 digits as 1e+14.
    local id_text = string.format('%d', seq)
    local packed = nil
    for i = 1, #ids do
      local id = ids[i]
      local box = inbox[id]
      local dropped = drops[i] or 0
      if to_stream then
        -- config::COMMANDS_MAX
        redis.call('XADD', prefix .. ':node:' .. id .. ':commands', 'MAXLEN', 100, '*',
          'i', seq, 't', '', 'f', sender, 'p', payload, 'k', mode)
      else
        if dropped > 0 then
          -- Drop the oldest unread to make room: counted, never silent.
          redis.call('HINCRBY', prefix .. ':node:' .. id, 'dropped', dropped)
        end
        if box[4] and mode ~= 'command' then
          packed = packed or (id_text .. ' ' .. topic .. ' ' .. sender .. '\n' .. payload)
          if dropped > 0 then
            redis.call('XADD', box[1], 'MAXLEN', box[3], '*', 'm', packed)
          else
            redis.call('XADD', box[1], '*', 'm', packed)
          end
        else
          -- A node of an older version: the fields it knows.
          local xadd = {box[1]}
          if dropped > 0 then
            xadd[#xadd + 1] = 'MAXLEN'
            xadd[#xadd + 1] = box[3]
          end
          for _, v in ipairs({'*', 'i', seq}) do xadd[#xadd + 1] = v end
          if topic ~= '' then
            xadd[#xadd + 1] = 't'
            xadd[#xadd + 1] = topic
          end
          for _, v in ipairs({'f', sender, 'p', payload}) do xadd[#xadd + 1] = v end
          if mode == 'command' then
            xadd[#xadd + 1] = 'k'
            xadd[#xadd + 1] = mode
          end
          redis.call('XADD', unpack(xadd))
        end
      end
    end
    out[#out + 1] = id_text
    local reached = reached_text[ids]
    if not reached then reached = tostring(#ids); reached_text[ids] = reached end
    out[#out + 1] = reached
  end
end
return table.concat(out, ' ')
