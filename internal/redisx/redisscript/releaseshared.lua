-- releaseshared: end a shared lease if it is still valid, and wake the
-- waiters if a waiter has marked the lock key. The single-Redis backend
-- only; the layout is in shared.lua, prepended to this script.
--
-- KEYS[1]: the lock key
-- KEYS[2]: the holders (sorted set; same hash slot as KEYS[1])
-- KEYS[3]: the holders' tokens (hash; same slot)
-- ARGV[1]: the lease's value
--
-- Returns 1 when the lease was valid and is now ended, 0 when it was not
-- (released already, expired, or the key is not held by shared leases any
-- more): nothing was changed then; 2 when the lease is ended but the
-- PUBLISH that wakes the waiters failed (as release.lua). The last holder
-- out deletes the holders, the tokens and the lock key, or leaves the lock
-- key reserved for a writer that waits (see shared.lua). A release is
-- published on KEYS[1] .. ':released' when the lock value is marked, as an
-- exclusive release is: every watcher of the key wakes (a watcher per
-- waiting Locker, see doc.go of the redis package), whether the release
-- freed a permit, the last reader's place for a writer, or both.
local now = clock()
local kind, permits, w, marked = parse(redis.call('GET', KEYS[1]))
if kind ~= 's' then
	return 0
end
local s = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not s or tonumber(s) <= now then
	return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if prune(KEYS[2], KEYS[3], now) > 0 then
	expire(KEYS[1], KEYS[2], KEYS[3], w)
else
	vacate(KEYS[1], KEYS[2], KEYS[3], now, w, marked)
end
if marked then
	local r = redis.pcall('PUBLISH', KEYS[1] .. ':released', '1')
	if type(r) == 'table' and r.err then
		return 2
	end
end
return 1
