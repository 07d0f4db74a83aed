-- refresh: extend the lock's TTL if it is still ours.
--
-- KEYS[1]: the lock key
-- KEYS[2]: optional (Redlock): the fencing counter key
-- ARGV[1]: the ownership value of the grant being refreshed
-- ARGV[2]: the new TTL in whole milliseconds
-- ARGV[3]: with KEYS[2]: the grant's token, a decimal integer without
--          leading zeros
--
-- With KEYS[2], the counter is first raised to at least the token (as
-- raise.lua does), whether or not the lock is still ours here: Redlock
-- skips the write-back of the token to a node whose clock passes it before
-- the lock key can expire there, and a refresh to a shorter TTL moves that
-- expiry earlier. The single-Redis backend passes KEYS[1] only (its
-- counter already holds the token).
--
-- Returns 1 when the lock was ours and now expires ARGV[2] ms from now, 0
-- when it was not ours. A missing key is never re-created. The value is
-- ARGV[1], or ARGV[1] .. '+' once a waiter has marked it (acquire.lua).
if KEYS[2] then
	-- below: in below.lua, prepended to this script (exact, on the
	-- decimal strings).
	if below(redis.call('GET', KEYS[2]), ARGV[3]) then
		redis.call('SET', KEYS[2], ARGV[3])
	end
end
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or v == ARGV[1] .. '+' then
	return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
