# Written by `paratrain plot`; run `gnuplot plot.gp` in this folder to redraw.
set terminal pngcairo size 1000,640 noenhanced font ',11'
set grid
set key outside right top
set output 'accuracy_vs_epoch.png'
set title 'test accuracy'
set xlabel 'epoch'
set ylabel 'accuracy (%)'
set format x '%g'
plot 'data/teacher_cnn/version_0.eval.dat' using 1:5 with linespoints lc 1 title 'teacher_cnn/version_0', \
     'data/mlp_labels_s0/version_0.eval.dat' using 1:5 with linespoints lc 2 title 'mlp_labels_s0/version_0', \
     'data/mlp_distill_s0/version_0.eval.dat' using 1:5 with linespoints lc 3 title 'mlp_distill_s0/version_0', \
     'data/teacher_gpt/version_0.eval.dat' using 1:5 with linespoints lc 4 title 'teacher_gpt/version_0', \
     'data/gpt_labels_s0/version_0.eval.dat' using 1:5 with linespoints lc 5 title 'gpt_labels_s0/version_0', \
     'data/gpt_distill_s0/version_0.eval.dat' using 1:5 with linespoints lc 6 title 'gpt_distill_s0/version_0'
set output 'accuracy_vs_samples.png'
set title 'test accuracy'
set xlabel 'training samples seen'
set ylabel 'accuracy (%)'
set format x '%.1s%c'
plot 'data/teacher_cnn/version_0.eval.dat' using 3:5 with linespoints lc 1 title 'teacher_cnn/version_0', \
     'data/mlp_labels_s0/version_0.eval.dat' using 3:5 with linespoints lc 2 title 'mlp_labels_s0/version_0', \
     'data/mlp_distill_s0/version_0.eval.dat' using 3:5 with linespoints lc 3 title 'mlp_distill_s0/version_0', \
     'data/teacher_gpt/version_0.eval.dat' using 3:5 with linespoints lc 4 title 'teacher_gpt/version_0', \
     'data/gpt_labels_s0/version_0.eval.dat' using 3:5 with linespoints lc 5 title 'gpt_labels_s0/version_0', \
     'data/gpt_distill_s0/version_0.eval.dat' using 3:5 with linespoints lc 6 title 'gpt_distill_s0/version_0'
set output 'loss_vs_epoch.png'
set title 'loss (test: solid, train: dashed)'
set xlabel 'epoch'
set ylabel 'loss'
set format x '%g'
plot 'data/teacher_cnn/version_0.eval.dat' using 1:4 with linespoints lc 1 title 'teacher_cnn/version_0 test', \
     'data/teacher_cnn/version_0.train.dat' using 1:4 with lines dt 2 lc 1 title 'teacher_cnn/version_0 train', \
     'data/mlp_labels_s0/version_0.eval.dat' using 1:4 with linespoints lc 2 title 'mlp_labels_s0/version_0 test', \
     'data/mlp_labels_s0/version_0.train.dat' using 1:4 with lines dt 2 lc 2 title 'mlp_labels_s0/version_0 train', \
     'data/mlp_distill_s0/version_0.eval.dat' using 1:4 with linespoints lc 3 title 'mlp_distill_s0/version_0 test', \
     'data/mlp_distill_s0/version_0.train.dat' using 1:4 with lines dt 2 lc 3 title 'mlp_distill_s0/version_0 train', \
     'data/teacher_gpt/version_0.eval.dat' using 1:4 with linespoints lc 4 title 'teacher_gpt/version_0 test', \
     'data/teacher_gpt/version_0.train.dat' using 1:4 with lines dt 2 lc 4 title 'teacher_gpt/version_0 train', \
     'data/gpt_labels_s0/version_0.eval.dat' using 1:4 with linespoints lc 5 title 'gpt_labels_s0/version_0 test', \
     'data/gpt_labels_s0/version_0.train.dat' using 1:4 with lines dt 2 lc 5 title 'gpt_labels_s0/version_0 train', \
     'data/gpt_distill_s0/version_0.eval.dat' using 1:4 with linespoints lc 6 title 'gpt_distill_s0/version_0 test', \
     'data/gpt_distill_s0/version_0.train.dat' using 1:4 with lines dt 2 lc 6 title 'gpt_distill_s0/version_0 train'
set output 'loss_vs_samples.png'
set title 'loss (test: solid, train: dashed)'
set xlabel 'training samples seen'
set ylabel 'loss'
set format x '%.1s%c'
plot 'data/teacher_cnn/version_0.eval.dat' using 3:4 with linespoints lc 1 title 'teacher_cnn/version_0 test', \
     'data/teacher_cnn/version_0.train.dat' using 3:4 with lines dt 2 lc 1 title 'teacher_cnn/version_0 train', \
     'data/mlp_labels_s0/version_0.eval.dat' using 3:4 with linespoints lc 2 title 'mlp_labels_s0/version_0 test', \
     'data/mlp_labels_s0/version_0.train.dat' using 3:4 with lines dt 2 lc 2 title 'mlp_labels_s0/version_0 train', \
     'data/mlp_distill_s0/version_0.eval.dat' using 3:4 with linespoints lc 3 title 'mlp_distill_s0/version_0 test', \
     'data/mlp_distill_s0/version_0.train.dat' using 3:4 with lines dt 2 lc 3 title 'mlp_distill_s0/version_0 train', \
     'data/teacher_gpt/version_0.eval.dat' using 3:4 with linespoints lc 4 title 'teacher_gpt/version_0 test', \
     'data/teacher_gpt/version_0.train.dat' using 3:4 with lines dt 2 lc 4 title 'teacher_gpt/version_0 train', \
     'data/gpt_labels_s0/version_0.eval.dat' using 3:4 with linespoints lc 5 title 'gpt_labels_s0/version_0 test', \
     'data/gpt_labels_s0/version_0.train.dat' using 3:4 with lines dt 2 lc 5 title 'gpt_labels_s0/version_0 train', \
     'data/gpt_distill_s0/version_0.eval.dat' using 3:4 with linespoints lc 6 title 'gpt_distill_s0/version_0 test', \
     'data/gpt_distill_s0/version_0.train.dat' using 3:4 with lines dt 2 lc 6 title 'gpt_distill_s0/version_0 train'
set output 'perplexity_vs_epoch.png'
set title 'validation perplexity'
set xlabel 'epoch'
set ylabel 'perplexity'
set format x '%g'
plot 'data/teacher_cnn/version_0.eval.dat' using 1:6 with linespoints lc 1 title 'teacher_cnn/version_0', \
     'data/mlp_labels_s0/version_0.eval.dat' using 1:6 with linespoints lc 2 title 'mlp_labels_s0/version_0', \
     'data/mlp_distill_s0/version_0.eval.dat' using 1:6 with linespoints lc 3 title 'mlp_distill_s0/version_0', \
     'data/teacher_gpt/version_0.eval.dat' using 1:6 with linespoints lc 4 title 'teacher_gpt/version_0', \
     'data/gpt_labels_s0/version_0.eval.dat' using 1:6 with linespoints lc 5 title 'gpt_labels_s0/version_0', \
     'data/gpt_distill_s0/version_0.eval.dat' using 1:6 with linespoints lc 6 title 'gpt_distill_s0/version_0'
