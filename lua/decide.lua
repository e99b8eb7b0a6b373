-- The driver: several limits of one principal, checked and charged
-- atomically (Redis runs a script whole). Time comes from Redis TIME, so every
-- gateway shares one clock.
--
-- KEYS[i]          state of limit i; all keys of one call share a hash tag
-- ARGV[5(i-1)+1]   algorithm of limit i: 1 gcra, 2 fixed window, 3 sliding
--                  log, 4 sliding window counter
-- ARGV[5(i-1)+2]   parameter a of the algorithm (see its file)
-- ARGV[5(i-1)+3]   parameter b of the algorithm
-- ARGV[5(i-1)+4]   flags: 1 = shadow (evaluated and reported, never denies)
-- ARGV[5(i-1)+5]   cost of the request for limit i, in tokens: > 0 charges,
--                  0 only reports, < 0 refunds an earlier charge (always
--                  applied, never denies)
--
-- A request passes only if every enforcing limit admits it; then every limit
-- that admits it is charged (a shadow limit that would deny is not). When it
-- is denied nothing is charged.
--
-- Returns a flat array of integers:
--   { allowed, n, now_us, then per limit i: ok_i, remaining_i, retry_ms_i, reset_ms_i }
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = #KEYS
local allowed = 1
local res = {}

for i = 1, n do
	local o = 1 + 5 * (i - 1)
	local alg = ALG[tonumber(ARGV[o])]
	if not alg then return redis.error_reply('unknown algorithm ' .. tostring(ARGV[o])) end
	local cost = tonumber(ARGV[o + 4])
	local r = alg(KEYS[i], now, cost, tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]))
	r.shadow = tonumber(ARGV[o + 3]) % 2 == 1
	if cost < 0 then r.ok = 1; r.retry = 0 end
	if r.ok == 0 and not r.shadow then allowed = 0 end
	res[i] = r
end

local out = { allowed, n, now }
for i = 1, n do
	local r = res[i]
	local charged = allowed == 1 and r.ok == 1
	if charged then r.commit() end
	out[#out + 1] = r.ok
	out[#out + 1] = charged and r.rem_c or r.rem_u
	out[#out + 1] = math.ceil(r.retry / 1000)
	out[#out + 1] = math.ceil((charged and r.reset_c or r.reset_u) / 1000)
end
return out
