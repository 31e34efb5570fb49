-- Removes the whole schema. The cluster-wide role judge_legacy_worker stays
-- (other databases of the cluster may use it); its grants go with the tables.
DROP TABLE IF EXISTS judge_dispatch_state, judge_nodes, first_passes,
    submission_judgings, submissions, problems, users CASCADE;
