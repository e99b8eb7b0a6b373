-- Sliding window counter: the current and the previous fixed window, the
-- previous one weighted by how much of it still overlaps the sliding window.
-- Two numbers per key ("<window index>:<current>:<previous>"), close to the
-- sliding log without its memory. The weighted count prev x left / win is a
-- double (prev <= 2^50, left <= 2^45: no overflow; rounded, not exact, when
-- the product passes 2^53, identically in the C model); it only decides, the
-- counts stored are integers.
--   a = window length (us), b = limit (requests per window)
-- State for the commit: s1, s2 = the current and previous counts before this
-- request.
local function sliding_window_check(v, now, cost, win, limit, at)
	local floor = math.floor
	local COUNT_MAX = 2 ^ 50
	local idx = floor(now / win)
	local cur, prev = 0, 0
	if v then
		local w, c, p, e = string.match(v, '^(%d+):(%d+):(%d+)()', at or 1)
		if w and (string.byte(v, e) or 124) == 124 then
			w = w + 0
			if w == idx then
				cur, prev = c + 0, p + 0
				if cur > COUNT_MAX then cur = COUNT_MAX end
				if prev > COUNT_MAX then prev = COUNT_MAX end
			elseif w == idx - 1 then
				prev = c + 0
				if prev > COUNT_MAX then prev = COUNT_MAX end
			end
		end
	end
	local elapsed = now - idx * win
	local left = win - elapsed
	local est = floor(prev * left / win) + cur
	local after = est + cost
	if after < 0 then after = 0 end
	local rem_c, rem_u = 0, 0
	if limit > after then rem_c = limit - after end
	if limit > est then rem_u = limit - est end
	local reset_u = 0
	if cur > 0 then reset_u = left + win elseif prev > 0 then reset_u = left end
	if est + cost <= limit then
		return 1, rem_c, rem_u, 0, left + win, reset_u, cur, prev
	end
	-- retry: the first instant the estimate admits <cost>. With the previous
	-- window weighing p and L tokens of room, floor(p * (win - e) / win) <= L
	-- holds from e = floor(win - (L + 1) * win / p) + 1 on.
	local retry
	if cost > limit then
		retry = left + win
	elseif cur + cost <= limit then
		local e = floor(win - (limit - cur - cost + 1) * win / prev) + 1
		retry = e - elapsed
		if retry < 1 then retry = 1 end
	elseif cur <= limit - cost then
		retry = left
	else
		-- in the next window this one's count becomes the previous weight
		local e = floor(win - (limit - cost + 1) * win / cur) + 1
		if e < 0 then e = 0 end
		retry = left + e
	end
	return 0, rem_c, rem_u, retry, left + win, reset_u, cur, prev
end

local function sliding_window_commit(now, cost, win, limit, cur, prev)
	local idx = math.floor(now / win)
	local left = win - (now - idx * win)
	local c = cur + cost
	if c < 0 then c = 0 elseif c > 2 ^ 50 then c = 2 ^ 50 end -- COUNT_MAX
	return string.format('%d:%d:%d', idx, c, prev), math.ceil((left + win) / 1000) + 1
end
