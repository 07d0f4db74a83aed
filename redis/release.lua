-- release: delete the lock if it is still ours and wake the waiters.
--
-- KEYS[1]: the lock key
-- ARGV[1]: the ownership value of the grant being released
-- ARGV[2]: the release notification channel (same hash tag as KEYS[1])
--
-- Returns 1 when the lock was ours and is now deleted, 0 when it was not
-- ours (released already, expired, or held by a newer holder): nothing was
-- changed then.
if redis.call('GET', KEYS[1]) == ARGV[1] then
	redis.call('DEL', KEYS[1])
	redis.call('PUBLISH', ARGV[2], '1')
	return 1
end
return 0
