#pragma once

// The Redis store's Lua scripts: one per step, each one round trip (EVALSHA) that reads the
// record, applies SPEC §4 by the server's clock (TIME) and writes. Every script touches the
// record's key (KEYS[1]); acquire also touches the store's token key (KEYS[2]). Values are
// laid out as redis_layout.h describes; `struct` is the library Redis bundles with its Lua.
//
// Shared rules:
//  - now = TIME in ms; a record counts by its own fields judged against now, never by its
//    key's existence alone (a key may have lost its expiry: PERSIST, RESTORE with TTL 0).
//  - tokens are TIME in µs, raised above the record's token and above the token key, which
//    holds the largest token the store has issued (docs/stores/redis.md, "Tokens"), so a
//    token is never issued twice for a key whatever the server's clock does.
//  - A key expires 1 ms before the instant SPEC §4 allows its record to be dropped, because
//    Redis keeps a key while now <= its expiry time: a COMPLETE record exactly at
//    expires_at - 1 (PXAT); an IN_PROGRESS one exactly at max(expires_at,
//    lease_expires_at) - 1 (PXAT), or later (KEEPTTL), never earlier. PX would count from
//    the server's clock when SET runs, which may be milliseconds past the script's TIME.
//  - A value that is not a record (an unknown kind, too short for its kind, another Redis
//    type) is answered with an error naming it, never read as one.
//  - Every read comes before the first write, and a script writes either everything or
//    nothing: a command the server refuses (an ACL, memory) stops the script before any
//    write, never between two writes of one record. The notification after the write is a
//    redis.pcall: a server without SPUBLISH, or an ACL that denies it, never fails a write.
//  - Numbers reach Redis through struct.pack and command arguments, never through Lua's
//    string conversion (14 digits, too few for a token). Each script does the least on its
//    common path (measured in instructions with callgrind): a redis.call costs about as
//    much as the rest of a script, a returned table of numbers more than a string.

namespace idem::redis {

struct ScriptSource {
  const char* name;
  const char* body;
};

// KEYS: the record, the token key. ARGV: lease ms, ttl ms, fingerprint section. Replies: a COMPLETE
// value (Replay); {now, value} (Busy); the new IN_PROGRESS record's header and fingerprint
// (Acquired; its attempt > 1 means stolen).
//
// The token key is read and written with one SET ... GET: the common case (the clock moved
// on since the last token) costs one command. Only when the clock is behind the largest
// token issued (it stepped back) is the token raised above it and written again. A new
// lease's key expires exactly at max(expires_at, lease_expires_at) - 1.
inline constexpr ScriptSource kAcquireScript{"acquire", R"lua(
local v = redis.call('GET', KEYS[1])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local tok, att = t[1] * 1000000 + t[2], 1
if v then
  local k = string.byte(v)
  if not (#v >= 42 and (k == 67 or k == 80) or #v == 37 and k == 84) then
    return redis.error_reply('ERR not an idem record')
  end
  local old, _, lease, exp, n = struct.unpack('>I8I8I8I8I4', v, 2)
  if k == 67 then
    if exp > now then return v end
  elseif k == 80 then
    if lease > now then return {now, v} end
    att = n + 1
  end
  if tok <= old then tok = old + 1 end
end
local top = redis.pcall('SET', KEYS[2], struct.pack('>I8', tok), 'GET')
if top then
  if type(top) == 'table' then
    if string.sub(top.err, 1, 9) == 'WRONGTYPE' then
      return redis.error_reply('ERR not an idem token key')
    end
    return top
  end
  if #top ~= 8 then
    redis.call('SET', KEYS[2], top)
    return redis.error_reply('ERR not an idem token key')
  end
  top = struct.unpack('>I8', top)
  if tok <= top then
    tok = top + 1
    redis.call('SET', KEYS[2], struct.pack('>I8', tok))
  end
end
local lease, exp = now + ARGV[1], now + ARGV[2]
local h = struct.pack('>BI8I8I8I8I4', 80, tok, now, lease, exp, att) .. ARGV[3]
redis.call('SET', KEYS[1], h, 'PXAT', math.max(lease, exp) - 1)
return h
)lua"};

// ARGV: token, ttl ms, payload, notify ('1': SPUBLISH on the record's key once it is
// COMPLETE, for waiters in other processes; redis_subscriber.h). Replies 1 (done) or 0
// (fenced). The expiry is exact
// (PXAT). A large payload is appended rather than concatenated in Lua, which would copy it
// twice more (half the time for megabytes), but only when the ACL lets the caller APPEND:
// otherwise the SET would land without its payload. A small one is cheaper in one SET.
//
// A repeat (COMPLETE with this token, SPEC §4) writes the record again as it is: with
// wait_replicas, the WAIT after it then counts a write that follows the first one in the
// replication stream (WAIT counts only this connection's writes, and the repeat may go out
// on another connection), and a key that lost its expiry gets it back.
inline constexpr ScriptSource kCompleteScript{"complete", R"lua(
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local k = string.byte(v)
if not (#v >= 42 and (k == 67 or k == 80) or #v == 37 and k == 84) then
  return redis.error_reply('ERR not an idem record')
end
local tok, _, _, exp = struct.unpack('>I8I8I8I8', v, 2)
if k == 84 or tok ~= tonumber(ARGV[1]) then return 0 end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if k == 67 then
  if exp <= now then return 0 end
  redis.call('SET', KEYS[1], v, 'PXAT', exp - 1)
  return 1
end
exp = now + ARGV[2]
local head = struct.pack('>BI8I8I8I8I4', 67, tok, now, 0, exp, 0) .. string.sub(v, 38)
if #ARGV[3] < 65536 or not (redis.acl_check_cmd and redis.acl_check_cmd('APPEND', KEYS[1], '')) then
  redis.call('SET', KEYS[1], head .. ARGV[3], 'PXAT', exp - 1)
else
  redis.call('SET', KEYS[1], head, 'PXAT', exp - 1)
  redis.call('APPEND', KEYS[1], ARGV[3])
end
if ARGV[4] == '1' then redis.pcall('SPUBLISH', KEYS[1], '') end
return 1
)lua"};

// ARGV: token (release: only an IN_PROGRESS record with it), or '' (forget: whatever the
// key holds, a value that is not a record included); notify ('1': SPUBLISH on the key once
// it is deleted). Replies 1 (deleted) or 0 (fenced, or
// nothing to forget; a tombstone of an earlier version reads as nothing).
inline constexpr ScriptSource kDeleteScript{"delete", R"lua(
local v = redis.pcall('GET', KEYS[1])
if not v then return 0 end
local foreign = type(v) == 'table'
if foreign and string.sub(v.err, 1, 9) ~= 'WRONGTYPE' then return v end
local k = not foreign and string.byte(v)
foreign = foreign or not (#v >= 42 and (k == 67 or k == 80) or #v == 37 and k == 84)
if ARGV[1] == '' then
  redis.call('DEL', KEYS[1])
  if ARGV[2] == '1' then redis.pcall('SPUBLISH', KEYS[1], '') end
  if k == 84 and not foreign then return 0 end
  return 1
end
if foreign then return redis.error_reply('ERR not an idem record') end
if k ~= 80 or struct.unpack('>I8', v, 2) ~= tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[2] == '1' then redis.pcall('SPUBLISH', KEYS[1], '') end
return 1
)lua"};

// ARGV: token, lease ms. Replies the new lease deadline (ms), or 0 (fenced). The key's
// expiry only moves out: kept when the TTL already outlasts the new lease (the usual
// heartbeat), else set to the new lease deadline - 1.
inline constexpr ScriptSource kExtendScript{"extend", R"lua(
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local k = string.byte(v)
if not (#v >= 42 and (k == 67 or k == 80) or #v == 37 and k == 84) then
  return redis.error_reply('ERR not an idem record')
end
if k ~= 80 then return 0 end
local tok, _, _, exp = struct.unpack('>I8I8I8I8', v, 2)
if tok ~= tonumber(ARGV[1]) then return 0 end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local lease = now + ARGV[2]
local nv = string.sub(v, 1, 17) .. struct.pack('>I8', lease) .. string.sub(v, 26)
if lease <= exp then
  redis.call('SET', KEYS[1], nv, 'KEEPTTL')
else
  redis.call('SET', KEYS[1], nv, 'PXAT', lease - 1)
end
return lease
)lua"};

// Reads without writing (get, and acquire on a read-only store). Replies {now, value}, or
// {now} when there is no record; the client decodes the value (and names one that is not a
// record).
inline constexpr ScriptSource kPeekScript{"peek", R"lua(
local t = redis.call('TIME')
local v = redis.call('GET', KEYS[1])
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if v and (string.byte(v) ~= 84 or #v ~= 37) then return {now, v} end
return {now}
)lua"};

enum ScriptId { kAcquire, kComplete, kDelete, kExtend, kPeek, kScriptCount };

inline constexpr const ScriptSource* kScripts[kScriptCount] = {
    &kAcquireScript, &kCompleteScript, &kDeleteScript, &kExtendScript, &kPeekScript};

}  // namespace idem::redis
