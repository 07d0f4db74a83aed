-- forsakeshared: forsake.lua for a shared acquire (a permit or a reader's
-- lease) given up by its caller: end the lease if the acquire took it (as
-- releaseshared.lua does), and leave a tombstone of its value (bury, in
-- cut.lua) so that the acquire, if it is still on its way to the server,
-- takes nothing when it arrives (acquireshared.lua refuses it). cut.lua
-- and shared.lua are prepended to this script.
--
-- KEYS[1]: the lock key
-- KEYS[2]: the holders (sorted set; same hash slot as KEYS[1])
-- KEYS[3]: the holders' tokens (hash; same slot)
-- KEYS[4]: the fencing counter key (same slot)
-- ARGV[1]: the value of the acquire given up
-- ARGV[2]: how long the tombstone is in force, in whole milliseconds
--
-- Returns releaseshared.lua's reply.
local now = clock()
bury(KEYS[4], ARGV[1], now, tonumber(ARGV[2]))
return release(KEYS[1], KEYS[2], KEYS[3], ARGV[1], now)
