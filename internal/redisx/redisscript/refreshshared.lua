-- refreshshared: extend a shared lease if it is still valid. The
-- single-Redis backend only; the layout and refresh are in shared.lua,
-- prepended to this script.
--
-- KEYS[1]: the lock key
-- KEYS[2]: the holders (sorted set; same hash slot as KEYS[1])
-- KEYS[3]: the holders' tokens (hash; same slot)
-- ARGV[1]: the lease's value
-- ARGV[2]: the new TTL in whole milliseconds
--
-- Returns 1 when the lease was valid and now expires ARGV[2] ms from now
-- (the lock key, the holders and the tokens then expire with the last
-- holder), 0 when it was not: a lease that is gone is never re-created.
local now = clock()
return refresh(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], now)
