-- The reader has taken every inbox entry up to ARGV[1] (exclusive bound):
-- trim them, so the stream holds exactly the unread backlog.
-- KEYS: inbox, node hash
-- ARGV: first id not yet read
-- Returns {backlog, dropped so far}.
redis.call('XTRIM', KEYS[1], 'MINID', ARGV[1])
return {redis.call('XLEN', KEYS[1]), tonumber(redis.call('HGET', KEYS[2], 'dropped') or '0')}
