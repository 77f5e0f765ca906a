"""The Lua scripts Sluice runs, one constant each, with the keys and arguments they take.

Scripts never build key names: every key arrives in KEYS (built by :mod:`store.keys`),
so prefixes and Redis Cluster hash tags stay right. Each script touches one hash tag.
"""

from __future__ import annotations

__all__ = [
    "COMMIT",
    "DEAD_LETTER",
    "DELIVER",
    "ADVANCE_CURSOR",
    "LEASE_ACQUIRE",
    "LEASE_RENEW",
    "LEASE_RELEASE",
    "FENCE",
    "PROJECT",
    "SNAPSHOT",
    "BY_NAME",
    "STALE",
    "RESTARTED",
    "NOT_A_STREAM",
    "BAD_COMMIT",
]

STALE = "SLUICE_STALE"
RESTARTED = "SLUICE_RESTARTED"
NOT_A_STREAM = "SLUICE_NOT_A_STREAM"
BAD_COMMIT = "SLUICE_BAD_COMMIT"

# The server's run id changes at every restart, and a failover puts another node (another run
# id, a new replication id) in the dead master's place. A writer that read the server's
# identity before it began (a leader, when it took over) passes it; a script refuses to write
# for a writer that has not seen the restart or the failover, whose memory may hold writes the
# server lost ('' skips the check). What the writer passes is a comma-separated list of what
# it saw: run ids (one Redis), or '<run id>:<master_replid>' per master of a cluster
# (store/shards.py); the node's own must be among them. The reply names the node as the
# writer named it. INFO replication is asked only of a writer that named replication ids.
_RESTARTED = """
local function restarted(expected)
  if expected == '' then
    return nil
  end
  local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  if run == expected then
    return nil
  end
  local me = run
  if string.find(expected, ':', 1, true) then
    me = run .. ':' .. string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)')
  end
  for seen in string.gmatch(expected, '[^,]+') do
    if seen == run or seen == me then
      return nil
    end
  end
  return redis.error_reply('SLUICE_RESTARTED ' .. me)
end
"""

# Compare two stream ids "ms-seq"; true when a > b.
_NEWER = """
local function newer(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end
"""

COMMIT = (
    _NEWER
    + _RESTARTED
    + """
-- Atomic, fenced commit of the events some messages caused.
-- KEYS[1]  fence key of the tag being written
-- KEYS[2]  inbox stream the consumed entries belong to (any key of the tag if none)
-- KEYS[3..] streams the events are appended to (all in the same tag), and the tag's outbox
--          cursor when ARGV[5+n] names it
-- ARGV[1]  writer epoch
-- ARGV[2]  the server run id the writer expects ('' to skip the check)
-- ARGV[3]  consumer group of the inbox, '' when no inbox entry is consumed
-- ARGV[4]  n, the number of consumed inbox entries; ARGV[5 .. 4+n] their ids (each once)
-- ARGV[5+n] index into KEYS of the outbox cursor to move forward (0: none), ARGV[6+n] the
--          last outbox entry the writer delivered (with all before it): ADVANCE_CURSOR, carried
--          by the next commit instead of a round trip of its own (a cursor key that holds
--          another kind of value is left alone: the cursor only saves work)
-- ARGV[7+n ..] per event, three values: index into KEYS, encoded envelope, outbox target ('' if none)
-- Returns {'OK', id..., [before]} | {'DUP'} (an entry was already acknowledged: a redelivery; nothing
-- is written or acknowledged) | error 'SLUICE_STALE <fence>' | error 'SLUICE_RESTARTED <run id>'
-- | error 'SLUICE_BAD_COMMIT ...' (the same entry twice: a bug in the writer) | error
-- 'SLUICE_NOT_A_STREAM <key> is a <type>'. An error reply means nothing was written.
-- before: when an event has an outbox target, the last entry id of the stream the first
-- such event goes to, as it was before this commit ('' if it was empty), so the committer
-- can deliver what it wrote without reading it back when its cursor is there.
local err = restarted(ARGV[2])
if err then
  return err
end
local epoch = tonumber(ARGV[1])
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if epoch < fence then
  return redis.error_reply('SLUICE_STALE ' .. fence)
end
local n = tonumber(ARGV[4])
-- Every check comes before the first write (a script that fails half-way keeps what it
-- wrote, and an acknowledged entry whose events were not appended is lost).
local ci = tonumber(ARGV[5 + n] or '')
if ci == nil or (ci ~= 0 and (ci < 3 or ci > #KEYS or ci ~= math.floor(ci)
    or not string.match(ARGV[6 + n] or '', '^%d+%-%d+$'))) then
  return redis.error_reply('SLUICE_BAD_COMMIT the cursor to advance is not a key and an entry id')
end
local checked = {}
for i = 7 + n, #ARGV, 3 do
  if ci > 0 and tonumber(ARGV[i]) == ci then
    return redis.error_reply('SLUICE_BAD_COMMIT the cursor to advance is a stream the commit appends to')
  end
  local key = KEYS[tonumber(ARGV[i])]
  if not checked[key] then
    checked[key] = true
    local kind = redis.call('TYPE', key)['ok']
    if kind ~= 'stream' and kind ~= 'none' then
      return redis.error_reply('SLUICE_NOT_A_STREAM ' .. key .. ' is a ' .. kind)
    end
  end
end
if ARGV[3] ~= '' and n > 0 then
  if n == 1 then
    if redis.call('XACK', KEYS[2], ARGV[3], ARGV[5]) == 0 then
      return {'DUP'}
    end
  else
    local seen = {}
    for i = 5, 4 + n do
      if seen[ARGV[i]] then
        return redis.error_reply('SLUICE_BAD_COMMIT entry ' .. ARGV[i] .. ' is consumed twice in one commit')
      end
      seen[ARGV[i]] = true
      if #redis.call('XPENDING', KEYS[2], ARGV[3], ARGV[i], ARGV[i], 1) == 0 then
        return {'DUP'}
      end
    end
    local ids = {}
    for i = 5, 4 + n do
      ids[#ids + 1] = ARGV[i]
    end
    redis.call('XACK', KEYS[2], ARGV[3], unpack(ids))
  end
end
if epoch > fence then
  redis.call('SET', KEYS[1], epoch)
end
if ci > 0 then
  local kind = redis.call('TYPE', KEYS[ci])['ok']
  local cur = kind == 'string' and redis.call('GET', KEYS[ci]) or nil
  if kind == 'none' or (cur and (not string.match(cur, '^%d+%-%d+$') or newer(ARGV[6 + n], cur))) then
    redis.call('SET', KEYS[ci], ARGV[6 + n])
  end
end
local before = nil
for i = 7 + n, #ARGV, 3 do
  if ARGV[i + 2] ~= '' then
    local last = redis.call('XREVRANGE', KEYS[tonumber(ARGV[i])], '+', '-', 'COUNT', 1)
    before = last[1] and last[1][1] or ''
    break
  end
end
local out = {'OK'}
for i = 7 + n, #ARGV, 3 do
  local key = KEYS[tonumber(ARGV[i])]
  if ARGV[i + 2] == '' then
    out[#out + 1] = redis.call('XADD', key, '*', 'e', ARGV[i + 1])
  else
    out[#out + 1] = redis.call('XADD', key, '*', 'e', ARGV[i + 1], 'to', ARGV[i + 2])
  end
end
if before then
  out[#out + 1] = before
end
return out
"""
)

DEAD_LETTER = """
-- Park an entry that cannot be decoded, and acknowledge it, in one step.
-- KEYS[1]  the stream the entry is in
-- KEYS[2]  the dead-letter stream of the same tag
-- ARGV[1]  consumer group ('' when the entry was not read through a group)
-- ARGV[2]  entry id
-- ARGV[3]  error kind, ARGV[4] reason (what is wrong, for a person)
-- ARGV[5..] the entry's own fields and values, kept as they were
-- Returns the dead-letter entry id, or 0 when the entry was already parked by another consumer.
-- The entry is parked before it is acknowledged: if parking fails, it stays pending.
if ARGV[1] ~= '' then
  if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1) == 0 then
    return 0
  end
end
local args = {KEYS[2], '*', 'stream', KEYS[1], 'entry', ARGV[2], 'kind', ARGV[3], 'reason', ARGV[4]}
for i = 5, #ARGV, 2 do
  args[#args + 1] = 'field:' .. ARGV[i]
  args[#args + 1] = ARGV[i + 1]
end
local id = redis.call('XADD', unpack(args))
if ARGV[1] ~= '' then
  redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
end
return id
"""

SET_ASIDE = """
-- An inbox that holds another kind of value than a stream (something other than Sluice
-- wrote its key) is moved aside, kept for a person to look at, and made again, empty, with
-- its consumer group: one bad key must not stop its reader (a leader reads every job's
-- inbox in one call, and one such key failed them all).
-- KEYS[1]  the inbox
-- KEYS[2]  where its value goes (a new key of the same tag)
-- ARGV[1]  the consumer group that reads the inbox (created at '0'); '' from a writer,
--          which leaves the inbox missing (its next append makes it; the reader, finding
--          no group, makes its group at '0' and reads what was appended)
-- Returns the type of what was moved aside, or '' when nothing was (the inbox is a stream,
-- or is missing: then it is made, with its group).
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'stream' then
  return ''
end
if kind ~= 'none' then
  redis.call('RENAME', KEYS[1], KEYS[2])
end
if ARGV[1] ~= '' then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
end
if kind == 'none' then
  return ''
end
return kind
"""

DELIVER = (
    _NEWER
    + _RESTARTED
    + """
-- Deliver outbox entries into an inbox of another tag, each exactly once.
-- KEYS[1]  target inbox stream
-- KEYS[2]  target's delivered hash: origin outbox -> last outbox entry id delivered
-- ARGV[1]  the server run id the deliverer expects ('' to skip the check)
-- ARGV[2]  origin outbox key
-- ARGV[3..] pairs: outbox entry id, encoded envelope (in outbox order)
-- Every deliverer hands a target the entries of an outbox in outbox order and never skips
-- one, so the target's mark is enough to drop what was delivered before.
-- Returns the number of entries appended (the rest were delivered before) | error
-- 'SLUICE_NOT_A_STREAM <type>' (the target is some other kind of key; nothing written) |
-- error 'SLUICE_RESTARTED <run id>'
local err = restarted(ARGV[1])
if err then
  return err
end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'stream' and kind ~= 'none' then
  return redis.error_reply('SLUICE_NOT_A_STREAM ' .. kind)
end
local last = redis.call('HGET', KEYS[2], ARGV[2])
local n = 0
for i = 3, #ARGV, 2 do
  if not last or newer(ARGV[i], last) then
    redis.call('XADD', KEYS[1], '*', 'e', ARGV[i + 1], 'from', ARGV[2], 'ref', ARGV[i])
    last = ARGV[i]
    n = n + 1
  end
end
if n > 0 then
  redis.call('HSET', KEYS[2], ARGV[2], last)
end
return n
"""
)

ADVANCE_CURSOR = (
    _NEWER
    + _RESTARTED
    + """
-- Move an outbox's delivery cursor forward (never back): everything up to it is delivered.
-- KEYS[1]  the cursor key (in the outbox's tag)
-- ARGV[1]  the server run id the deliverer expects ('' to skip the check)
-- ARGV[2]  the last outbox entry id delivered
-- Returns the cursor now in force | error 'SLUICE_RESTARTED <run id>'
local err = restarted(ARGV[1])
if err then
  return err
end
local cur = redis.call('GET', KEYS[1])
if not cur or newer(ARGV[2], cur) then
  redis.call('SET', KEYS[1], ARGV[2])
  return ARGV[2]
end
return cur
"""
)

LEASE_ACQUIRE = """
-- Take the leadership lease if nobody holds it; a takeover increases the epoch.
-- KEYS[1] lease hash (holder, epoch), KEYS[2] epoch counter, KEYS[3] fence of the cluster tag
-- ARGV[1] holder id, ARGV[2] lease time in ms
-- Returns {epoch, 1} when taken now, {epoch, 0} when already held by this holder (renewed),
-- {epoch_of_other_holder, -ttl_left_ms} when someone else holds it.
local holder = redis.call('HGET', KEYS[1], 'holder')
if holder then
  local epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch'))
  if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {epoch, 0}
  end
  -- never -0: at the lease's last millisecond that would read as 'renewed' (a second leader)
  return {epoch, -math.max(redis.call('PTTL', KEYS[1]), 1)}
end
local epoch = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'epoch', epoch)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local fence = tonumber(redis.call('GET', KEYS[3]) or '0')
if epoch > fence then
  redis.call('SET', KEYS[3], epoch)
end
return {epoch, 1}
"""

LEASE_RENEW = (
    _RESTARTED
    + """
-- Extend the lease if this holder still has it at this epoch.
-- KEYS[1] lease hash; ARGV[1] holder id, ARGV[2] epoch, ARGV[3] lease time in ms,
-- ARGV[4] the server run id the holder expects ('' to skip the check)
-- Returns 1 when renewed, 0 when the lease is gone or held by another | error 'SLUICE_RESTARTED <run id>'
local err = restarted(ARGV[4])
if err then
  return err
end
if redis.call('HGET', KEYS[1], 'holder') == ARGV[1] and redis.call('HGET', KEYS[1], 'epoch') == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
"""
)

LEASE_RELEASE = """
-- Give the lease up (graceful stop) so a standby need not wait for it to expire.
-- KEYS[1] lease hash; ARGV[1] holder id, ARGV[2] epoch
if redis.call('HGET', KEYS[1], 'holder') == ARGV[1] and redis.call('HGET', KEYS[1], 'epoch') == ARGV[2] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

FENCE = (
    _RESTARTED
    + """
-- Raise a tag's fence to the writer's epoch (a new leader claims the tag).
-- KEYS[1] fence key; ARGV[1] epoch, ARGV[2] the server run id the writer expects ('' to skip)
-- Returns the fence now in force; an error 'SLUICE_STALE <fence>' if the epoch is older,
-- 'SLUICE_RESTARTED <run id>' if the server restarted.
local err = restarted(ARGV[2])
if err then
  return err
end
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
local epoch = tonumber(ARGV[1])
if epoch < fence then
  return redis.error_reply('SLUICE_STALE ' .. fence)
end
redis.call('SET', KEYS[1], epoch)
return epoch
"""
)

PROJECT = (
    _RESTARTED
    + """
-- Write a read model's changed rows together with the log position they reflect, once.
-- KEYS[1] position key, KEYS[2] table hash
-- ARGV[1] the server run id the writer read the log from ('' to skip the check)
-- ARGV[2] position the writer started from ('' for none), ARGV[3] new position,
-- ARGV[4] number of rows to set (n), ARGV[5 .. 4+2n] field/value pairs, then fields to delete
-- Returns 1 when written, 0 when the position moved meanwhile (already projected) |
-- error 'SLUICE_RESTARTED <run id>' (what the writer read may have been lost)
local err = restarted(ARGV[1])
if err then
  return err
end
local cur = redis.call('GET', KEYS[1]) or ''
if cur ~= ARGV[2] then
  return 0
end
local n = tonumber(ARGV[4])
local i = 5
if n > 0 then
  local args = {}
  for j = 1, 2 * n do
    args[j] = ARGV[i]
    i = i + 1
  end
  redis.call('HSET', KEYS[2], unpack(args))
end
if i <= #ARGV then
  local dels = {}
  for j = i, #ARGV do
    dels[#dels + 1] = ARGV[j]
  end
  redis.call('HDEL', KEYS[2], unpack(dels))
end
redis.call('SET', KEYS[1], ARGV[3])
return 1
"""
)

SNAPSHOT = (
    _RESTARTED
    + """
-- Store a leader's snapshot of one tag's state, with the fact entry id it covers, fenced.
-- KEYS[1] fence key of the tag, KEYS[2] the tag's fact stream, KEYS[3] the snapshot hash
-- ARGV[1] writer epoch, ARGV[2] the server run id the writer expects ('' to skip the check),
-- ARGV[3] the encoded snapshot
-- The position is the fact stream's last entry ('0-0' when empty), read here: only the leader
-- of the fence's epoch appends facts to the tag, so its state covers exactly those facts.
-- Returns the position written | error 'SLUICE_STALE <fence>' | error 'SLUICE_RESTARTED <run id>'
local err = restarted(ARGV[2])
if err then
  return err
end
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < fence then
  return redis.error_reply('SLUICE_STALE ' .. fence)
end
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
local pos = '0-0'
if #last > 0 then
  pos = last[1][1]
end
redis.call('HSET', KEYS[3], 'pos', pos, 'data', ARGV[3])
return pos
"""
)


BY_NAME = {
    "commit": COMMIT,
    "fence": FENCE,
    "dead_letter": DEAD_LETTER,
    "deliver": DELIVER,
    "advance_cursor": ADVANCE_CURSOR,
    "lease_acquire": LEASE_ACQUIRE,
    "lease_renew": LEASE_RENEW,
    "lease_release": LEASE_RELEASE,
    "project": PROJECT,
    "snapshot": SNAPSHOT,
    "set_aside": SET_ASIDE,
}
"""The Lua of every script the backends run by name."""
