-- SPDX-License-Identifier: MIT
-- spoa-ratelimit decision script, assembled at build time (see the Makefile's
-- LUA list): this prelude, one file per algorithm, then the driver decide.lua.
--
-- Every algorithm is a function check(key, now, cost, a, b) that reads its
-- state and returns, without writing anything:
--   ok         1 if this limit admits <cost> tokens now, else 0
--   rem_c      tokens left if the request is charged
--   rem_u      tokens left if it is not
--   retry      microseconds until this limit admits <cost> (0 when ok)
--   reset_c    microseconds until the limit is fully available again, charged
--   reset_u    the same, not charged
--   commit     a function that charges the request (called only if it passes)
-- All arithmetic is on integers below 2^53 (exact in Lua's doubles); the C
-- models in src/limiter.c do the same operations in the same order. Costs
-- (cost x units of a batch) are clamped to +-COUNT_MAX = 2^50 before any
-- algorithm sees them, and the windows' counts to [0, COUNT_MAX], so a count
-- plus a cost stays exact (src/limiter.h, LIMIT_COUNT_MAX).
if redis.replicate_commands then pcall(redis.replicate_commands) end

local ALG = {}

local COUNT_MAX = 2 ^ 50
local LOG_ADD_MAX = 100 -- entries one call adds to a sliding log (sliding_log.lua)

local function clamp0(x)
	if x < 0 then return 0 end
	return x
end

-- x clamped to [-m, m]
local function clampm(x, m)
	if x > m then return m end
	if x < -m then return -m end
	return x
end
