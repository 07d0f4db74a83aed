-- release: delete the lock if it is still ours, and wake the waiters if a
-- waiter has marked the lock.
--
-- KEYS[1]: the lock key
-- KEYS[2]: optional (Redlock): the fencing counter key
-- ARGV[1]: the ownership value of the grant being released
-- ARGV[2]: with KEYS[2]: the grant's token, a decimal integer without
--          leading zeros
--
-- With KEYS[2], the counter is first raised to at least the token (as
-- raise.lua does), in the same script as the delete, whether or not the
-- lock was still ours here: Redlock's token is the largest of a majority's,
-- and a node that issued less learns it before its lock key can be taken
-- again by a release, at no extra round trip. The single-Redis backend
-- passes KEYS[1] only (its counter already holds the token).
--
-- Returns 1 when the lock was ours and is now deleted, 0 when it was not
-- ours (released already, expired, or held by a newer holder): nothing was
-- changed then; 2 when the lock was ours and is now deleted but the PUBLISH
-- that wakes its waiters failed (an ACL user without the right to publish
-- on the channel, say): the lock is released all the same (a script's
-- writes stand when a later call fails), and the waiters find it free when
-- they next poll. PUBLISH goes through redis.pcall so that its failure
-- does not make the script's reply an error that would hide the delete.
--
-- A failed acquire appends '+' (waitMark in redis.go) to the holder's value
-- (see acquire.lua), so the value is ARGV[1] or ARGV[1] .. '+'. Only a
-- marked lock's release is published, on the channel KEYS[1] .. ':released'
-- (releaseSuffix in redis.go; same hash tag as the key), which waiters
-- subscribe to before their marking attempt. The uncontended release is
-- thus a plain compare-and-delete.
if KEYS[2] then
	-- below: in below.lua, prepended to this script (exact, on the
	-- decimal strings).
	if below(redis.call('GET', KEYS[2]), ARGV[2]) then
		redis.call('SET', KEYS[2], ARGV[2])
	end
end
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
	redis.call('DEL', KEYS[1])
	return 1
end
if v == ARGV[1] .. '+' then
	redis.call('DEL', KEYS[1])
	local r = redis.pcall('PUBLISH', KEYS[1] .. ':released', '1')
	if type(r) == 'table' and r.err then
		return 2
	end
	return 1
end
return 0
