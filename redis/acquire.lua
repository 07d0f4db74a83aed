-- acquire: take the lock if it is free, and bump its fencing counter.
--
-- KEYS[1]: the lock key
-- KEYS[2]: the fencing counter key (same hash slot as KEYS[1], no TTL)
-- ARGV[1]: the ownership value, unique per grant
-- ARGV[2]: the TTL in whole milliseconds
--
-- Returns the counter's new value (> 0) when the lock was taken; when it is
-- held, -2 - PTTL, i.e. -1 for a key that has no expiry (PTTL -1) and
-- -2 - ms otherwise (so 0 is never returned). The counter is a token only
-- once it has been raised to the clock: a value below 2^50 means the counter
-- was lost, and the caller runs fence.lua (see doc.go).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	return redis.call('INCR', KEYS[2])
end
return -2 - redis.call('PTTL', KEYS[1])
