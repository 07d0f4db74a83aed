-- refreshmany: refresh.lua's compare-and-PEXPIRE (without a counter key)
-- for many locks in one script, so that a batch of refreshes costs one
-- command instead of one each (the single-Redis backend's RefreshBatch; all
-- keys must be in one hash slot on a Cluster, so a Cluster client does not
-- use it).
--
-- KEYS[i]: a lock key
-- ARGV[2i-1]: the ownership value of the grant being refreshed
-- ARGV[2i]: its new TTL in whole milliseconds
--
-- Returns an array: element i is 1 when lock i was ours and now expires
-- ARGV[2i] ms from now, 0 when it was not ours (a missing key is never
-- re-created). The value is ARGV[2i-1], or that with '+' once a waiter
-- has marked it (acquire.lua).
local r = {}
for i = 1, #KEYS do
	local v = redis.call('GET', KEYS[i])
	local a = ARGV[2 * i - 1]
	if v == a or v == a .. '+' then
		r[i] = redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
	else
		r[i] = 0
	end
end
return r
