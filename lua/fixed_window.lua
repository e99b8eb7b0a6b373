-- Fixed window: a counter per window of <a> microseconds, windows aligned on
-- the Unix epoch, so a 1d window resets at 00:00 UTC and 1h on the hour.
-- The key holds "<window index>:<count>".
--   a = window length (us), b = limit (requests per window)
-- State for the commit: s1 = the count before this request.
-- fixed_month (algorithm 5) is the same counter on calendar months in UTC: the
-- window's index is year x 12 + month - 1 (a = 1, unused). The calendar is
-- computed (days from 1970-01-01 and back, in eras of 400 years), as
-- limit_month_index() and limit_month_start_us() in src/core/limiter.c.
local function month_index(now)
	local floor = math.floor
	local z = floor(now / 86400000000) + 719468
	local era = floor(z / 146097)
	local doe = z - era * 146097
	local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
	local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
	local mp = floor((5 * doy + 2) / 153)
	local m = mp - 9
	if mp < 10 then m = mp + 3 end
	local y = yoe + era * 400
	if m <= 2 then y = y + 1 end
	return y * 12 + m - 1
end

local function month_start(idx)
	local floor = math.floor
	local y = floor(idx / 12)
	local m = idx - y * 12 + 1
	if m <= 2 then y = y - 1 end
	local era = floor(y / 400)
	local yoe = y - era * 400
	local mp = m + 9
	if m > 2 then mp = m - 3 end
	local doy = floor((153 * mp + 2) / 5)
	local doe = yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + doy
	return (era * 146097 + doe - 719468) * 86400000000
end

-- <idx> and <left> (us until the window's end) are given by the month's
-- functions only.
local function fixed_window_check(v, now, cost, win, limit, at, idx, left)
	if not idx then
		idx = math.floor(now / win)
		left = (idx + 1) * win - now
	end
	local count = 0
	if v then
		local w, c, e = string.match(v, '^(%d+):(%d+)()', at or 1)
		if w and w + 0 == idx and (string.byte(v, e) or 124) == 124 then
			count = c + 0
			if count > 2 ^ 50 then count = 2 ^ 50 end -- COUNT_MAX
		end
	end
	local after = count + cost
	if after < 0 then after = 0 end
	local rem_c, rem_u = 0, 0
	if limit > after then rem_c = limit - after end
	if limit > count then rem_u = limit - count end
	local reset_u = 0
	if count > 0 then reset_u = left end
	if count + cost <= limit then
		return 1, rem_c, rem_u, 0, left, reset_u, count
	end
	return 0, rem_c, rem_u, left, left, reset_u, count
end

local function fixed_window_commit(now, cost, win, limit, count, _, idx, left)
	if not idx then
		idx = math.floor(now / win)
		left = (idx + 1) * win - now
	end
	local c = count + cost
	if c < 0 then c = 0 elseif c > 2 ^ 50 then c = 2 ^ 50 end -- COUNT_MAX
	return string.format('%d:%d', idx, c), math.ceil(left / 1000) + 1
end

-- (the month's functions are the only ones that call others of the file)
local function fixed_month_check(v, now, cost, _, limit, at)
	local idx = month_index(now)
	return fixed_window_check(v, now, cost, 1, limit, at, idx, month_start(idx + 1) - now)
end

local function fixed_month_commit(now, cost, _, limit, count)
	local idx = month_index(now)
	return fixed_window_commit(now, cost, 1, limit, count, nil, idx, month_start(idx + 1) - now)
end
