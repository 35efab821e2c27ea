-- The reader has taken every inbox entry before first_unread (an exclusive
-- bound): trim them, so the stream holds exactly the unread backlog. Of the
-- entries taken since the last ack, those not trimmed here a publisher
-- dropped (MAXLEN) after the reader took them, and counted as dropped: the
-- node has them, so they come off the count.
-- KEYS: inbox, node hash
-- ARGV: first id not yet read, entries taken since the last ack
-- Returns {backlog, dropped so far}.
local inbox_key = KEYS[1]
local node_key = KEYS[2]
local first_unread = ARGV[1]
local taken = ARGV[2]
local gone = redis.call('XTRIM', inbox_key, 'MINID', first_unread)
local late = tonumber(taken) - gone
local dropped = tonumber(redis.call('HGET', node_key, 'dropped') or '0')
if late > 0 and dropped > 0 then
    dropped = math.max(dropped - late, 0)
    redis.call('HSET', node_key, 'dropped', dropped)
end
return {redis.call('XLEN', inbox_key), dropped}
