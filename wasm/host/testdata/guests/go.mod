module hostguests

go 1.26
