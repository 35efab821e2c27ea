-- Shared part: terms carry the store's history (see term.rs). A term is
-- epoch * TERM_SPAN + n, n from 1; the constants come from term.rs.
-- The clock's epoch at `ms` (0 before the anchor).
local function epoch_at(ms)
  local e = math.floor((ms - EPOCH_ANCHOR) / EPOCH_MS)
  if e < 0 then return 0 end
  return e
end
-- The term after `base`: the count wraps into the next epoch, never to 0.
local function next_term(base)
  local t = base + 1
  if t % TERM_SPAN == 0 then t = t + 1 end
  return t
end
-- How long (ms) before `term` may be granted at `now`: a term of epoch e
-- waits until the clock reads e's start plus the hold, so that a later
-- history, on a clock that has not stepped back by more than the
-- allowance, starts a greater epoch. Epoch 0 (the clock before the
-- anchor) never waits, and neither does an epoch that starts more than the
-- hold ahead of this clock: only a clock that ran ahead by more than the
-- allowance makes one, and waiting for it could last for ever; the term is
-- still above every one this store knows.
local function epoch_wait(term, now)
  local e = math.floor(term / TERM_SPAN)
  if e == 0 then return 0 end
  local start = EPOCH_ANCHOR + e * EPOCH_MS
  if start > now + EPOCH_HOLD then return 0 end
  local ready = start + EPOCH_HOLD
  if ready > now then return ready - now end
  return 0
end
-- A term as Redis stores it: every digit, never an exponent.
local function term_text(t)
  return string.format('%.0f', t)
end
