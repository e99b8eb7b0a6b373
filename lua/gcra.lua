-- SPDX-License-Identifier: MIT
-- GCRA (generic cell rate algorithm: a token bucket kept as one number) for
-- several limits of one principal, checked and charged atomically.
--
-- KEYS[i]    bucket of limit i: holds the theoretical arrival time (TAT) in
--            microseconds of Redis time. All keys of one call share a hash tag.
-- ARGV[1]    cost in tokens (integer >= 0; 0 only reports)
-- ARGV[2i]   emission interval T of limit i, microseconds per token (>= 1)
-- ARGV[2i+1] burst tolerance tau of limit i, microseconds (= T * burst)
--
-- A request passes only if every limit admits it; when one denies, none is
-- charged. Time comes from Redis TIME, so every gateway shares one clock.
--
-- Returns a flat array of integers:
--   { allowed, n, now_us, then per limit i: allowed_i, remaining_i, retry_ms_i, reset_ms_i }
--   now_us       the Redis time used (lets tests replay the C model exactly)
--   remaining_i  tokens left after this request (before it, when not charged)
--   retry_ms_i   ms until limit i would admit this cost (0 if it does now)
--   reset_ms_i   ms until bucket i is full again
-- Written keys expire when their bucket is full again.
if redis.replicate_commands then pcall(redis.replicate_commands) end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cost = tonumber(ARGV[1])
local n = #KEYS
local allowed = 1
local tats, newtats, oks = {}, {}, {}

for i = 1, n do
	local T = tonumber(ARGV[2 * i])
	local tau = tonumber(ARGV[2 * i + 1])
	local tat = tonumber(redis.call('GET', KEYS[i]) or 0) or 0
	if tat < now then tat = now end
	local newtat = tat + T * cost
	tats[i] = tat
	newtats[i] = newtat
	if newtat - tau > now then
		oks[i] = 0
		allowed = 0
	else
		oks[i] = 1
	end
end

local out = { allowed, n, now }
for i = 1, n do
	local T = tonumber(ARGV[2 * i])
	local tau = tonumber(ARGV[2 * i + 1])
	local tat = tats[i]
	if allowed == 1 then
		tat = newtats[i]
		local ttl = math.ceil((tat - now) / 1000)
		if ttl < 1 then ttl = 1 end
		redis.call('SET', KEYS[i], string.format('%d', tat), 'PX', ttl)
	end
	local remaining = tau - (tat - now)
	if remaining < 0 then remaining = 0 end
	remaining = math.floor(remaining / T)
	local retry = 0
	if oks[i] == 0 then retry = math.ceil((newtats[i] - tau - now) / 1000) end
	out[#out + 1] = oks[i]
	out[#out + 1] = remaining
	out[#out + 1] = retry
	out[#out + 1] = math.ceil((tat - now) / 1000)
end
return out
