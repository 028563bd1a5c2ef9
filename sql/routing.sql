-- routing.sql: the portable ordering-key and partition hashes.
--
-- These must match Awa byte for byte (docs/sql-api.md, "Routing"). All
-- arithmetic is unsigned 64-bit, wrapping. PL/pgSQL has no unsigned 64-bit
-- type, so the state is kept as two 32-bit limbs in bigints, where no
-- intermediate value can overflow.

-- Function: awa._hash64_limbs(key bytea) returns bigint[]
-- hash64 as {high 32 bits, low 32 bits}: h = 14695981039346656037, then for
-- each byte h = h * 1099511628211 + b. 1099511628211 = 256 * 2^32 + 435.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._hash64_limbs(key bytea)
returns bigint[]
language plpgsql
immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
declare
    hi bigint := 3421674724;  -- 14695981039346656037 >> 32
    lo bigint := 2216829733;  -- 14695981039346656037 & 0xffffffff
    t bigint;
    b0 bigint;
begin
    -- Two bytes per step: h = h * P^2 + b0 * P + b1, where
    -- P^2 mod 2^64 = 222720 * 2^32 + 189225 and P = 256 * 2^32 + 435.
    for i in 0 .. length(key) - 2 by 2 loop
        b0 := get_byte(key, i);
        t := lo * 189225 + b0 * 435 + get_byte(key, i + 1);
        hi := (hi * 189225 + lo * 222720 + b0 * 256 + (t >> 32)) & 4294967295;
        lo := t & 4294967295;
    end loop;
    if length(key) % 2 = 1 then
        t := lo * 435;
        hi := (hi * 435 + lo * 256 + (t >> 32)) & 4294967295;
        lo := (t & 4294967295) + get_byte(key, length(key) - 1);
        hi := (hi + (lo >> 32)) & 4294967295;
        lo := lo & 4294967295;
    end if;
    return array[hi, lo];
end;
$$;

-- Function: awa._limbs_mod(limbs bigint[], m integer) returns integer
-- (hi * 2^32 + lo) mod m without leaving bigint.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._limbs_mod(limbs bigint[], m integer)
returns integer
language plpgsql
immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    return ((limbs[1] % m) * (4294967296 % m) + limbs[2] % m) % m;
end;
$$;

-- Function: awa._limbs_numeric(limbs bigint[]) returns numeric
-- The two limbs as one unsigned 64-bit number: hi * 2^32 + lo.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._limbs_numeric(limbs bigint[])
returns numeric
language sql
immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select limbs[1]::numeric * 4294967296 + limbs[2]
$$;

-- Function: awa._mix_limbs(key bytea, salt_hi bigint, salt_lo bigint) returns bigint[]
-- v = hash64(key) xor salt, then the splitmix64 finaliser. Shifts and xors
-- run on the limbs; each 64-bit multiplication by a constant runs on
-- 16-bit pieces of the limbs and of the constant, so that no product or
-- sum passes 2^63: (hi, lo) * (c_hi, c_lo) mod 2^64 is lo * c_lo, whose
-- high 32 bits go up, plus (hi * c_lo + lo * c_hi) mod 2^32 in the high
-- limb. In numeric, as before, one key cost about 15 us.
-- Calls: awa._hash64_limbs
-- Writes: nothing
create or replace function awa._mix_limbs(key bytea, salt_hi bigint, salt_lo bigint)
returns bigint[]
language plpgsql
immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
declare
    h bigint[] := awa._hash64_limbs(key);
    hi bigint := h[1] # salt_hi;
    lo bigint := h[2] # salt_lo;
    -- lo's two 16-bit pieces, the middle partial product, the low one
    a1 bigint;
    a0 bigint;
    p1 bigint;
    t bigint;
begin
    -- v ^= v >> 30
    lo := lo # (((hi << 2) | (lo >> 30)) & 4294967295);
    hi := hi # (hi >> 30);
    -- v *= 0xbf58476d1ce4e5b9: c_lo = 7396 * 2^16 + 58809,
    -- c_hi = 48984 * 2^16 + 18285
    a1 := lo >> 16;
    a0 := lo & 65535;
    p1 := a1 * 58809 + a0 * 7396;
    t := a0 * 58809 + ((p1 & 65535) << 16);
    hi := ((t >> 32) + (p1 >> 16) + a1 * 7396
           + (hi & 65535) * 58809 + ((((hi >> 16) * 58809 + (hi & 65535) * 7396) & 65535) << 16)
           + a0 * 18285 + (((a1 * 18285 + a0 * 48984) & 65535) << 16)) & 4294967295;
    lo := t & 4294967295;
    -- v ^= v >> 27
    lo := lo # (((hi << 5) | (lo >> 27)) & 4294967295);
    hi := hi # (hi >> 27);
    -- v *= 0x94d049bb133111eb: c_lo = 4913 * 2^16 + 4587,
    -- c_hi = 38096 * 2^16 + 18875
    a1 := lo >> 16;
    a0 := lo & 65535;
    p1 := a1 * 4587 + a0 * 4913;
    t := a0 * 4587 + ((p1 & 65535) << 16);
    hi := ((t >> 32) + (p1 >> 16) + a1 * 4913
           + (hi & 65535) * 4587 + ((((hi >> 16) * 4587 + (hi & 65535) * 4913) & 65535) << 16)
           + a0 * 18875 + (((a1 * 18875 + a0 * 38096) & 65535) << 16)) & 4294967295;
    lo := t & 4294967295;
    -- v ^= v >> 31
    lo := lo # (((hi << 1) | (lo >> 31)) & 4294967295);
    hi := hi # (hi >> 31);
    return array[hi, lo];
end;
$$;

-- Function: awa._partition_limbs(key bytea) returns bigint[]
-- The partition hash: salt 0x9d4d1b2f53a70c91.
-- Calls: awa._mix_limbs
-- Writes: nothing
create or replace function awa._partition_limbs(key bytea)
returns bigint[]
language plpgsql
immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    return awa._mix_limbs(key, 2639076143, 1403456657);
end;
$$;

-- Function: awa.stripe_for_ordering_key(key bytea, stripes integer) returns integer
-- Which stripe of a striped queue a key goes to: a third hash, independent
-- of the shard hash and the partition hash (salt 0x6a09e667f3bcc909), so
-- that stripes, partitions and shards do not correlate. awa-sql's own;
-- stripes are internal storage, not part of Awa's routing contract.
-- Calls: awa._limbs_mod, awa._mix_limbs
-- Writes: nothing
create or replace function awa.stripe_for_ordering_key(key bytea, stripes integer)
returns integer
language plpgsql
immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    if stripes <= 1 then
        return 0;
    end if;
    return awa._limbs_mod(awa._mix_limbs(key, 1779033703, 4089235721), stripes);
end;
$$;

-- Function: awa._ordering_key_ok(key bytea) returns boolean
-- A job's ordering key: none, or at most 1024 bytes, the unique key's cap.
-- Its hash runs byte by byte in PL/pgSQL (about 150 ns a byte), and the
-- maintenance passes that move jobs into lanes (awa.promote_due,
-- awa.move_staged) hash every key they move: one job with a key of 20 MB
-- took the promote past its statement timeout, every pass, and so held
-- back every queue's due jobs. Every enqueue path that takes keys checks
-- it (awa.enqueue's general way, awa._enqueue_rows, COPY's movers).
-- Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._ordering_key_ok(key bytea)
returns boolean
language sql
immutable parallel safe
as $$
    select key is null or pg_catalog.length(key) operator(pg_catalog.<=) 1024
$$;

-- Function: awa._check_ordering_key(key bytea) returns void
-- Raises 22023 for a key awa._ordering_key_ok refuses, naming its length
-- and the cap.
-- Calls: awa._ordering_key_ok
-- Writes: nothing
create or replace function awa._check_ordering_key(key bytea)
returns void
language plpgsql
immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    if not awa._ordering_key_ok(key) then
        raise exception 'ordering_key must be at most 1024 bytes, got %', length(key)
            using errcode = '22023';
    end if;
end;
$$;

-- Function: awa.ordering_key_hash64(key bytea) returns numeric
-- The unsigned 64-bit ordering-key hash.
-- Calls: awa._hash64_limbs, awa._limbs_numeric
-- Writes: nothing
create or replace function awa.ordering_key_hash64(key bytea)
returns numeric
language sql
immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select awa._limbs_numeric(awa._hash64_limbs(key))
$$;

-- Function: awa._key_shard(key bytea, shards integer) returns smallint
-- hash64(key) mod shards: the per-row hot path of batch and COPY enqueue.
-- PL/pgSQL calling PL/pgSQL; a chain of SQL-language helpers cost three
-- times as much. When shards is a power of two it divides 2^64, so only
-- hash64 mod 64 matters: six bits of state, four bytes per step, no limbs.
-- Calls: awa._hash64_limbs
-- Writes: nothing
create or replace function awa._key_shard(key bytea, shards integer)
returns smallint
language plpgsql
immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
declare
    h bigint[];
    low integer := 37;  -- 14695981039346656037 mod 64
    n integer;
begin
    if shards <= 1 then
        return 0;
    end if;
    if shards & (shards - 1) = 0 then
        -- h = h * P + b mod 64, P = 51 mod 64; four bytes per step with
        -- P^4 = 17, P^3 = 43, P^2 = 41 mod 64.
        n := length(key);
        for i in 0 .. n - 4 by 4 loop
            low := (low * 17 + get_byte(key, i) * 43 + get_byte(key, i + 1) * 41
                    + get_byte(key, i + 2) * 51 + get_byte(key, i + 3)) & 63;
        end loop;
        for i in n - n % 4 .. n - 1 loop
            low := (low * 51 + get_byte(key, i)) & 63;
        end loop;
        return (low & (shards - 1))::smallint;
    end if;
    h := awa._hash64_limbs(key);
    return ((h[1] % shards) * (4294967296 % shards) + h[2] % shards) % shards;
end;
$$;

-- Function: awa.shard_for_ordering_key(key bytea, shards integer) returns smallint
-- 0 when shards <= 1, else hash64(key) mod shards, for the S a queue can
-- have (at most 64: awa._key_shard's shortcut for a power of two keeps
-- hash64 mod 64 only).
-- Errors: 22023 shards above 64.
-- Calls: awa._key_shard
-- Writes: nothing
create or replace function awa.shard_for_ordering_key(key bytea, shards integer)
returns smallint
language plpgsql
immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    if shards > 64 then
        raise exception 'shards must be at most 64 (a queue''s enqueue shards are 1 to 64), got %',
            shards
            using errcode = '22023';
    end if;
    return awa._key_shard(key, shards);
end;
$$;

-- Function: awa.partition_hash64(key bytea) returns numeric
-- The unsigned 64-bit partition hash.
-- Calls: awa._limbs_numeric, awa._partition_limbs
-- Writes: nothing
create or replace function awa.partition_hash64(key bytea)
returns numeric
language sql
immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select awa._limbs_numeric(awa._partition_limbs(key))
$$;

-- Function: awa.partition_for_ordering_key(key bytea, partitions integer) returns integer
-- 0 when partitions <= 1, else partition_hash64(key) mod partitions.
-- Calls: awa._limbs_mod, awa._partition_limbs
-- Writes: nothing
create or replace function awa.partition_for_ordering_key(key bytea, partitions integer)
returns integer
language plpgsql
immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    if partitions <= 1 then
        return 0;
    end if;
    return awa._limbs_mod(awa._partition_limbs(key), partitions);
end;
$$;

-- Function: awa.partition_queue_names(logical_queue text, partitions integer) returns text[]
-- [name] for one partition, else [name, name__p1, ..., name__p(P-1)].
-- Calls: nothing
-- Writes: nothing
create or replace function awa.partition_queue_names(logical_queue text, partitions integer)
returns text[]
language plpgsql
immutable strict parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    if partitions < 1 or partitions > 32767 then
        raise exception 'partitions must be between 1 and 32767, got %', partitions
            using errcode = '22023';
    end if;
    return array(
        select case when p = 0 then logical_queue else logical_queue || '__p' || p end
          from generate_series(0, partitions - 1) as p
         order by p
    );
end;
$$;

-- The public routing functions run with the caller's rights, so the pure
-- helpers they call are executable by every awa role too.
select awa._grant_execute(
    'awa._hash64_limbs(bytea)', 'producer', 'worker', 'maintenance', 'operator', 'reader'
);
select awa._grant_execute(
    'awa._limbs_mod(bigint[], integer)',
    'producer', 'worker', 'maintenance', 'operator', 'reader'
);
select awa._grant_execute(
    'awa._limbs_numeric(bigint[])', 'producer', 'worker', 'maintenance', 'operator', 'reader'
);
select awa._grant_execute(
    'awa._mix_limbs(bytea, bigint, bigint)',
    'producer', 'worker', 'maintenance', 'operator', 'reader'
);
select awa._grant_execute(
    'awa._partition_limbs(bytea)', 'producer', 'worker', 'maintenance', 'operator', 'reader'
);
select awa._grant_execute(
    'awa.stripe_for_ordering_key(bytea, integer)',
    'producer', 'worker', 'maintenance', 'operator', 'reader'
);
select awa._grant_execute(
    'awa._key_shard(bytea, integer)', 'producer', 'worker', 'maintenance', 'operator', 'reader'
);
select awa._grant_execute(
    'awa.ordering_key_hash64(bytea)',
    'producer', 'worker', 'maintenance', 'operator', 'reader'
);
select awa._grant_execute(
    'awa.shard_for_ordering_key(bytea, integer)',
    'producer', 'worker', 'maintenance', 'operator', 'reader'
);
select awa._grant_execute(
    'awa.partition_hash64(bytea)',
    'producer', 'worker', 'maintenance', 'operator', 'reader'
);
select awa._grant_execute(
    'awa.partition_for_ordering_key(bytea, integer)',
    'producer', 'worker', 'maintenance', 'operator', 'reader'
);
select awa._grant_execute(
    'awa.partition_queue_names(text, integer)',
    'producer', 'worker', 'maintenance', 'operator', 'reader'
);
select awa._grant_execute('awa._ordering_key_ok(bytea)');
select awa._grant_execute('awa._check_ordering_key(bytea)');
