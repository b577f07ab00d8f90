-- Issue 16: the pump's processed mark becomes a HOT update. A partial index whose predicate reads
-- `processed_at` made every mark a new version of the whole row (its body in the WAL) with new
-- entries in the primary key and in `delivery_key`'s index. Pending deliveries are now listed in
-- their own narrow table: the writer adds a delivery's id in the statement that stores it, the
-- pump locks the ids it takes there and deletes them in the transaction that marks the
-- deliveries processed. A delivery is pending while its id is in this table.
drop index webhook_deliveries_pending;
create table webhook_deliveries_pending (id uuid primary key);
insert into webhook_deliveries_pending (id) select id from webhook_deliveries where processed_at is null;
-- room on each page for its rows' processed versions: a HOT update stays on the row's page
alter table webhook_deliveries set (fillfactor = 50);
