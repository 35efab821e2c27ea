-- The reader has taken every inbox entry up to ARGV[1] (exclusive bound):
-- trim them, so the stream holds exactly the unread backlog. ARGV[2]
-- entries were taken since the last ack; those of them not trimmed here
-- a publisher dropped (MAXLEN) after the reader took them, and counted as
-- dropped: the node has them, so they come off the count.
-- KEYS: inbox, node hash
-- ARGV: first id not yet read, entries taken since the last ack
-- Returns {backlog, dropped so far}.
local gone = redis.call('XTRIM', KEYS[1], 'MINID', ARGV[1])
local late = tonumber(ARGV[2]) - gone
local dropped = tonumber(redis.call('HGET', KEYS[2], 'dropped') or '0')
if late > 0 and dropped > 0 then
    dropped = math.max(dropped - late, 0)
    redis.call('HSET', KEYS[2], 'dropped', dropped)
end
return {redis.call('XLEN', KEYS[1]), dropped}
