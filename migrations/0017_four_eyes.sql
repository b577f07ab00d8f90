-- Four eyes: the step of a job whose approval must come from someone other than the job's starter
-- (`created_by`). The worker that ran the step sets it when the step asks for approval and its
-- flow declares the step four-eyes; an approval by the starter is then refused.
alter table jobs add column four_eyes_step int;
