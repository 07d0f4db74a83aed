-- release: delete the lock if it is still ours, and wake the waiters if a
-- waiter has marked the lock.
--
-- KEYS[1]: the lock key
-- ARGV[1]: the ownership value of the grant being released
--
-- Returns 1 when the lock was ours and is now deleted, 0 when it was not
-- ours (released already, expired, or held by a newer holder): nothing was
-- changed then.
--
-- A failed acquire appends '+' (waitMark in redis.go) to the holder's value
-- (see acquire.lua), so the value is ARGV[1] or ARGV[1] .. '+'. Only a
-- marked lock's release is published, on the channel KEYS[1] .. ':released'
-- (releaseSuffix in redis.go; same hash tag as the key), which waiters
-- subscribe to before their marking attempt. The uncontended release is
-- thus a plain compare-and-delete.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
	redis.call('DEL', KEYS[1])
	return 1
end
if v == ARGV[1] .. '+' then
	redis.call('DEL', KEYS[1])
	redis.call('PUBLISH', KEYS[1] .. ':released', '1')
	return 1
end
return 0
