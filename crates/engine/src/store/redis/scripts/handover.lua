-- Release a lease to a named successor (step-down --to): as release.lua,
-- but only when the successor is a live member that may lead, and then
-- the other candidates leave the free seat to it until the window ends
-- (seat.lua). The wake-up says whom the seat went to
-- ('handover SUCCESSOR'), so the successor claims even while it abstains
-- after a step-down of its own.
-- KEYS: lease, members, priorities, seat
-- ARGV: node id, incarnation, term, wake channel (P:g:{G}:released),
--       successor id, window ms
-- Returns 1 released, 0 the lease is not ours (nothing changed), -1 the
-- successor is not a live member, -2 it campaigns with priority 0 (in
-- both cases the leader keeps its lease).
local now = now_ms()
if redis.call('GET', KEYS[1]) ~= ARGV[1] .. '#' .. ARGV[2] .. '#' .. ARGV[3] then return 0 end
local score = redis.call('ZSCORE', KEYS[2], ARGV[5])
if not score or tonumber(score) <= now then return -1 end
if priority_of(redis.call('HGET', KEYS[3], ARGV[5])) <= 0 then return -2 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[4], 'successor', ARGV[5], 'until', now + tonumber(ARGV[6]))
redis.call('HDEL', KEYS[4], 'vacant')
redis.call('PUBLISH', ARGV[4], 'handover ' .. ARGV[5])
return 1
