-- The driver: several limits of one principal, checked and charged
-- atomically (Redis runs a script whole). Time comes from Redis TIME, so every
-- gateway shares one clock.
--
-- KEYS[i]          state of limit i; all keys of one call share a hash tag
-- ARGV[5(i-1)+1]   algorithm of limit i: 1 gcra, 2 fixed window, 3 sliding
--                  log, 4 sliding window counter
-- ARGV[5(i-1)+2]   parameter a of the algorithm (see its file), an integer >= 1
-- ARGV[5(i-1)+3]   parameter b of the algorithm, an integer >= 0
-- ARGV[5(i-1)+4]   flags: 1 = shadow (evaluated and reported, never denies)
-- ARGV[5(i-1)+5]   cost of the request for limit i, in tokens: > 0 charges,
--                  0 only reports, < 0 refunds an earlier charge (always
--                  applied, never denies); an integer, clamped to +-2^50
--
-- Optional, after the limits (a batch: "units" of the request above):
-- ARGV[5n+1]       want: units asked for (1 to 2^50)
-- ARGV[5n+2]       mode: 0 = grant, up to <want> units, as many as every
--                  enforcing limit admits now, never more (a lease, or
--                  several coalesced requests); 1 = report, <want> units
--                  already admitted locally, charged whatever is left
-- ARGV[5n+3]       lease lifetime wanted (us); the answer shortens it so a
--                  lease never outlives the window of a windowed limit
-- ARGV[5n+4]       grant only: the fewest units worth a call (default 1), a
--                  lease. When fewer fit and a whole lease will fit within the
--                  lease lifetime, nothing is granted and the answer is a
--                  denial whose retry is when it fits (a hot key over its
--                  limit then costs one call per lease, not per request; the
--                  tokens wait in the bucket); when it would take longer (a
--                  window that ends later), what fits is granted
--
-- Without a batch, a request passes only if every enforcing limit admits it;
-- then every limit that admits it is charged (a shadow limit that would deny
-- is not). When it is denied nothing is charged.
--
-- Returns a flat array of integers:
--   { allowed, n, now_us, then per limit i: ok_i, remaining_i, retry_ms_i, reset_ms_i }
-- and with a batch two more: { ..., granted, lease_ms }: granted = units
-- charged (grant) or units that fitted (report; the rest were over the limit).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = #KEYS
local batch = #ARGV >= 5 * n + 3
local want = 1
local report = false
local minu = 1
local life = 0
if batch then
	want = tonumber(ARGV[5 * n + 1])
	report = tonumber(ARGV[5 * n + 2]) == 1
	life = tonumber(ARGV[5 * n + 3]) or 0
	minu = tonumber(ARGV[5 * n + 4]) or 1
	if not want or want < 1 or want > COUNT_MAX or want ~= math.floor(want) then
		return redis.error_reply('bad batch size ' .. tostring(ARGV[5 * n + 1]))
	end
end

local algs, ids, pa, pb, costs, shadows = {}, {}, {}, {}, {}, {}
for i = 1, n do
	local o = 1 + 5 * (i - 1)
	ids[i] = tonumber(ARGV[o])
	algs[i] = ALG[ids[i]]
	if not algs[i] then return redis.error_reply('unknown algorithm ' .. tostring(ARGV[o])) end
	pa[i] = tonumber(ARGV[o + 1])
	pb[i] = tonumber(ARGV[o + 2])
	costs[i] = tonumber(ARGV[o + 4])
	shadows[i] = (tonumber(ARGV[o + 3]) or 0) % 2 == 1
	-- integers only, and a bucket's interval and tolerance as src/limiter.h
	-- bounds them: nothing below may leave the exact range of doubles
	if not pa[i] or pa[i] < 1 or pa[i] ~= math.floor(pa[i]) or not pb[i] or pb[i] < 0 or
		pb[i] ~= math.floor(pb[i]) or (ids[i] == 1 and (pa[i] > 2 ^ 50 or
		pb[i] > 2 ^ 50 + 40 or pb[i] % pa[i] > 40)) then
		return redis.error_reply('bad parameters for limit ' .. i)
	end
	if not costs[i] or costs[i] ~= math.floor(costs[i]) then
		return redis.error_reply('bad cost ' .. tostring(ARGV[o + 4]))
	end
	costs[i] = clampm(costs[i], COUNT_MAX)
end

-- Checks every limit for <units> units; returns the results and whether every
-- enforcing limit admits them.
local function check(units)
	local res, all = {}, 1
	for i = 1, n do
		local cost = clampm(costs[i] * units, COUNT_MAX)
		local r = algs[i](KEYS[i], now, cost, pa[i], pb[i])
		r.shadow = shadows[i]
		if cost < 0 then r.ok = 1; r.retry = 0 end
		if r.ok == 0 and not r.shadow then all = 0 end
		res[i] = r
	end
	return res, all
end

-- The results for <units> units and how long until they fit (us, 0 = now).
-- Windows (fixed, sliding counter) only make room when they reset, and what
-- is left in the old one would be lost: for them there is no waiting.
local function batch_wait(units)
	local rm = check(units)
	local wait = 0
	for i = 1, n do
		if not shadows[i] and rm[i].ok == 0 then
			if ids[i] == 2 or ids[i] == 4 then return rm, math.huge end
			if rm[i].retry > wait then wait = rm[i].retry end
		end
	end
	return rm, wait
end

-- A report charges all <want> units: checked for them at once (what is left,
-- rem_u, does not depend on the cost asked).
local res, allowed = check(report and want or 1)
local granted = allowed
if batch and want > 1 and (allowed == 1 or report) then
	-- the most units every enforcing limit admits: what is left, in units
	local fit = want
	for i = 1, n do
		if not shadows[i] and costs[i] > 0 then
			local u = math.floor(res[i].rem_u / costs[i])
			if u < fit then fit = u end
		end
		if ids[i] == 3 and costs[i] > 0 and not report then
			-- a sliding log grows by at most LOG_ADD_MAX entries a call
			local u = math.floor(LOG_ADD_MAX / costs[i])
			if u < fit then fit = u end
		end
	end
	if report then
		granted = fit
		allowed = 1
	else
		if fit < 1 then fit = 1 end
		if fit < minu and minu <= want then
			-- wait for a whole lease if it comes soon enough
			local rm, wait = batch_wait(minu)
			if wait > 0 and wait <= life then
				res, allowed, granted, fit = rm, 0, 0, 0
			end
		end
	end
	if allowed == 1 and not report then
		local r2, ok2 = res, allowed
		if fit > 1 then r2, ok2 = check(fit) end
		-- rem_u is exact for every algorithm; search down if rounding disagrees
		if ok2 == 0 then
			local lo, hi = 1, fit - 1
			while lo < hi do
				local mid = math.floor((lo + hi + 1) / 2)
				local _, okm = check(mid)
				if okm == 1 then lo = mid else hi = mid - 1 end
			end
			fit = lo
			r2, ok2 = check(fit)
		end
		res, granted = r2, fit
	end
elseif batch and report then
	-- a report of one unit: charged even when it no longer fits
	granted = allowed
	allowed = 1
elseif batch and allowed == 0 and minu > 1 and minu <= want then
	-- denied: the retry is for a whole batch when it comes soon enough
	local rm, wait = batch_wait(minu)
	if wait <= life then res = rm end
end

local lease_ms = 0
if batch then
	for i = 1, n do
		if ids[i] == 2 or ids[i] == 4 then -- a = the window
			local left = (math.floor(now / pa[i]) + 1) * pa[i] - now
			if left < life then life = left end
		end
	end
	lease_ms = math.floor(life / 1000)
end

local out = { allowed, n, now }
for i = 1, n do
	local r = res[i]
	local charged = allowed == 1 and (r.ok == 1 or report)
	if charged then r.commit() end
	out[#out + 1] = r.ok
	out[#out + 1] = charged and r.rem_c or r.rem_u
	out[#out + 1] = math.ceil(r.retry / 1000)
	out[#out + 1] = math.ceil((charged and r.reset_c or r.reset_u) / 1000)
end
if batch then
	out[#out + 1] = (allowed == 1) and granted or 0
	out[#out + 1] = lease_ms
end
return out
