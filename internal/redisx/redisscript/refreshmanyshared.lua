-- refreshmanyshared: refreshshared.lua for many shared leases in one
-- script (the single-Redis backend's RefreshBatch on a single primary: the
-- keys of a script must share a slot on a Cluster, so a Cluster client
-- sends refreshshared.lua per lease instead). refresh is in shared.lua,
-- prepended to this script.
--
-- KEYS[3i-2], KEYS[3i-1], KEYS[3i]: lease i's lock key, holders and tokens
-- ARGV[2i-1]: lease i's value
-- ARGV[2i]: its new TTL in whole milliseconds
--
-- Returns an array: element i is 1 when lease i was valid and now expires
-- ARGV[2i] ms from now, 0 when it was not (it is never re-created).
local now = clock()
local r = {}
for i = 1, #KEYS / 3 do
	r[i] = refresh(KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], ARGV[2 * i - 1], ARGV[2 * i], now)
end
return r
