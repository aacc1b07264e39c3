set terminal pngcairo size 900,500
set output 'bench/results/plan/sweep.png'
set title 'SLO attainment (feasible requests) and cost against replicas, at the peak'
set xlabel 'replicas'
set ylabel 'SLO attainment, %'
set y2label 'dollars a day'
set ytics nomirror
set y2tics
set key bottom right
set grid
plot 'bench/results/plan/sweep.dat' using 1:2 with linespoints title 'premium', 'bench/results/plan/sweep.dat' using 1:3 with linespoints title 'standard', 'bench/results/plan/sweep.dat' using 1:4 with linespoints title 'free', 'bench/results/plan/sweep.dat' using 1:6 with linespoints dashtype 3 title 'premium at 2x the peak', 'bench/results/plan/sweep.dat' using 1:5 axes x1y2 with lines dashtype 2 title 'cost ($/day)'
